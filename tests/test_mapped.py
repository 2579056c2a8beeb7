"""Memory-mapped and row-read tensors (`specasr.models.mapped`) and the packed head they feed."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from specasr.cpu.linear import PackedHead
from specasr.models import mapped


@pytest.fixture()
def table(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(3, 4, generator=g), "table": torch.randn(1000, 16, generator=g)}
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path), metadata={"source_dtype": "float16"})
    return path, tensors["table"]


def test_span_map_and_rows_read_the_same_values(table):
    path, ref = table
    where = mapped.span(path, "table")
    assert where.shape == (1000, 16) and where.dtype == torch.float32
    assert mapped.span(path, "missing") is None
    assert mapped.metadata(path)["source_dtype"] == "float16"
    t = mapped.map_tensor(path, where)
    assert torch.equal(t, ref)
    assert torch.equal(mapped.read_rows(path, where, 10, 25), ref[10:25])
    ids = torch.tensor([999, 0, 5, 5, 512])
    assert torch.equal(mapped.gather_rows(t, ids, chunk=2), ref[ids])
    assert mapped.release(t) and torch.equal(t, ref)  # pages dropped, values read back in
    assert not mapped.release(ref)  # not a map: nothing to release


def test_a_truncated_file_is_refused(table):
    path, _ = table
    where = mapped.span(path, "table")
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="truncated"):
        mapped.read_rows(path, where, 990, 1000)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs a torch build with oneDNN")
def test_packed_head_equals_the_linear_at_every_row_count(table):
    path, ref = table
    where = mapped.span(path, "table")
    PackedHead.BLOCK, block = 300, PackedHead.BLOCK  # several blocks, the last one short
    try:
        head = PackedHead.build(
            mapped.map_tensor(path, where), lambda a, b: mapped.read_rows(path, where, a, b)
        )
    finally:
        PackedHead.BLOCK = block
    assert len(head.blocks) == 4 and head.bias is None
    x = torch.randn(2, 70, 16, generator=torch.Generator().manual_seed(1))
    for rows in (x[:1, :1], x[:1, :8], x):  # 1, 8 and 140 rows
        torch.testing.assert_close(head(rows), torch.nn.functional.linear(rows, ref), rtol=1e-5, atol=1e-5)
