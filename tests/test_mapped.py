"""Memory-mapped tensors and files (`specasr.models.mapped`) and the packed head they feed."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from specasr.backends.cpu.linear import PackedHead
from specasr.models import mapped


@pytest.fixture()
def table(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(3, 4, generator=g), "table": torch.randn(1000, 16, generator=g)}
    tensors["half"] = torch.randn(5, 2, generator=g).half()
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path), metadata={"source_dtype": "float16"})
    return path, tensors["table"]


def test_span_and_map_read_the_same_values(table):
    path, ref = table
    where = mapped.span(path, "table")
    assert where.shape == (1000, 16) and where.dtype == torch.float32
    assert mapped.span(path, "missing") is None
    assert mapped.metadata(path)["source_dtype"] == "float16"
    t = mapped.map_tensor(path, where)
    assert torch.equal(t, ref)
    ids = torch.tensor([999, 0, 5, 5, 512])
    assert torch.equal(mapped.gather_rows(t, ids, chunk=2), ref[ids])
    assert mapped.release(t) and torch.equal(t, ref)  # pages dropped, values read back in
    assert not mapped.release(ref)  # not a map: nothing to release


def test_a_mapped_file_holds_every_tensor_and_releases_its_pages(table):
    path, ref = table
    tensors = mapped.map_file(path, skip={"a"})
    assert set(tensors) == {"table", "half"}
    assert torch.equal(tensors["table"], ref) and tensors["half"].dtype == torch.float16
    assert mapped.release(tensors["half"])  # any tensor of the map drops the map's pages
    assert torch.equal(tensors["table"], ref)  # and the values come back from the file


def test_a_truncated_file_is_refused(table):
    path, _ = table
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="truncated"):
        mapped.map_file(path)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs a torch build with oneDNN")
def test_packed_head_equals_the_linear_at_every_row_count(table):
    path, ref = table
    where = mapped.span(path, "table")
    PackedHead.BLOCK, block = 300, PackedHead.BLOCK  # several blocks, the last one short
    try:
        table = mapped.map_tensor(path, where)
        head = PackedHead.build(table, lambda a, b: table[a:b])
    finally:
        PackedHead.BLOCK = block
    assert len(head.blocks) == 4 and head.bias is None
    x = torch.randn(2, 70, 16, generator=torch.Generator().manual_seed(1))
    for rows in (x[:1, :1], x[:1, :8], x):  # 1, 8 and 140 rows
        torch.testing.assert_close(head(rows), torch.nn.functional.linear(rows, ref), rtol=1e-5, atol=1e-5)


def test_a_module_owns_what_it_kept_of_a_map(table):
    path, ref = table
    tensors = mapped.map_file(path)
    module = torch.nn.Linear(16, 1000, bias=False)
    module.weight = torch.nn.Parameter(tensors["table"], requires_grad=False)  # a view of the map
    module.register_buffer("halves", tensors["half"])
    module.extra = tensors["a"].t()  # a plain attribute, a transposed view
    module.fresh = torch.ones(3)  # not from the map: left alone
    fresh = module.fresh
    mapped.own(module, tensors)
    spans = [(t.data_ptr(), t.data_ptr() + t.nbytes) for t in tensors.values()]
    for t in (module.weight, module.halves, module.extra):
        assert not any(a <= t.data_ptr() < b for a, b in spans)  # private memory now
    assert torch.equal(module.weight, ref) and torch.equal(module.extra, tensors["a"].t())
    assert module.fresh is fresh and not module.weight.requires_grad
    assert not mapped.release(tensors["table"])  # the map is forgotten: it closes with `tensors`
