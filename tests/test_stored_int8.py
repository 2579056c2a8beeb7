"""A distilled draft's int8 rows, stored by the first load and read by later ones
(`specasr.models.stored_int8`): the same rows, so the same draft; keyed by what they were made from."""

from __future__ import annotations

import shutil

import pytest
import torch

from specasr.backends.cpu import linear as L
from specasr.models.draft import load_draft
from specasr.models.loading import load_pair, packaged_draft
from specasr.models.stored_int8 import HEAD, StoredInt8

pytestmark = pytest.mark.skipif(not L.int8_available(), reason="this torch build has no fbgemm int8 linear")


def _same_rows(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and HEAD in a and len(a) > 1
    for name in a:
        x, y = a[name], b[name]
        assert torch.equal(x.q, y.q) and torch.equal(x.scale, y.scale) and torch.equal(x.sums, y.sums), name
        assert (x.bias is None) == (y.bias is None) and (x.bias is None or torch.equal(x.bias, y.bias)), name


def _logits(draft, target, states) -> torch.Tensor:
    from specasr.decode.runners import make_runner

    with torch.inference_mode():
        runner = make_runner(draft, states, make_runner(target, states))
        out = [runner(torch.tensor([[50258, 50259, 50359, 50363]]), 1)]
        out += [runner(torch.tensor([[tok]]), 1) for tok in (440, 2068, 3699)]
    return torch.cat(out, dim=1)  # [1, 4, V']


def test_stored_rows_make_the_draft_quantised_afresh(base_pair, tmp_path):
    t = base_pair.target
    fresh = load_draft(packaged_draft("base"), t, base_pair.dtype, base_pair.device).quantize_int8()
    rows = fresh.int8_rows()
    assert rows[HEAD].q.shape == (len(fresh.vocab_ids), t.config.d_model)
    entry = StoredInt8.for_draft(packaged_draft("base"), t.source, root=tmp_path)
    assert entry.write(rows) and entry.path.is_file()
    back = entry.read()
    _same_rows(rows, back)

    unread = load_draft(packaged_draft("base"), t, base_pair.dtype, base_pair.device, head=False)
    assert "head" not in unread._shared  # the head's rows were never gathered
    stored = unread.quantize_int8(stored=back)
    _same_rows(rows, stored.int8_rows())
    assert (stored.fused is None) == (fresh.fused is None)
    states = torch.randn(1, 1500, t.config.d_model, generator=torch.Generator().manual_seed(0))
    assert torch.equal(_logits(stored, t, states), _logits(fresh, t, states))


def test_the_key_follows_the_draft_bytes_the_target_and_nothing_else(base_pair, tmp_path):
    draft = tmp_path / "draft.safetensors"
    shutil.copy(packaged_draft("base"), draft)
    source = base_pair.target.source
    key = StoredInt8.for_draft(draft, source, root=tmp_path).path
    assert key == StoredInt8.for_draft(draft, source, root=tmp_path).path
    draft.touch()  # a new mtime, the same bytes: hashed again, the same entry
    assert StoredInt8.for_draft(draft, source, root=tmp_path).path == key
    with open(draft, "r+b") as f:  # one byte of a weight changed
        f.seek(-3, 2)
        byte = f.read(1)
        f.seek(-3, 2)
        f.write(bytes([byte[0] ^ 1]))
    assert StoredInt8.for_draft(draft, source, root=tmp_path).path != key
    other = tmp_path / "other-target"
    other.mkdir()
    (other / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes()[:64])
    assert (
        StoredInt8.for_draft(packaged_draft("base"), other, root=tmp_path).path
        != StoredInt8.for_draft(packaged_draft("base"), source, root=tmp_path).path
    )
    assert StoredInt8.for_draft(draft, None, root=tmp_path) is None  # a target built in memory
    assert StoredInt8.for_draft(draft, tmp_path / "empty", root=tmp_path) is None


def test_load_pair_stores_once_reads_after_and_rebuilds_a_torn_entry(base_pair, tmp_path, monkeypatch):
    """Through `load_pair`, as a user's processes load: the first load quantises and stores, the
    next quantises nothing, and an entry that cannot be read is quantised and written again."""
    monkeypatch.setenv("SPECASR_CACHE", str(tmp_path))
    calls = []
    quantize = L._quantize_rows
    monkeypatch.setattr(L, "_quantize_rows", lambda *a: calls.append(1) or quantize(*a))
    source, draft = str(base_pair.target.source), str(packaged_draft("base"))

    first = load_pair(source, draft, device="cpu")
    (entry,) = (tmp_path / "int8").glob("draft-*.safetensors")
    made = len(calls)
    assert made == len(first.draft.int8_rows())  # each product and the head, once
    second = load_pair(source, draft, device="cpu")
    assert len(calls) == made  # read, not quantised
    _same_rows(first.draft.int8_rows(), second.draft.int8_rows())

    entry.write_bytes(b"not a safetensors file")
    third = load_pair(source, draft, device="cpu")
    assert len(calls) == 2 * made
    _same_rows(first.draft.int8_rows(), third.draft.int8_rows())
    assert StoredInt8(entry).read() is not None  # written whole again


def test_a_cache_that_cannot_be_written_costs_only_the_quantising(base_pair, tmp_path, monkeypatch):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache directory would be")
    monkeypatch.setenv("SPECASR_CACHE", str(blocker))
    entry = StoredInt8.for_draft(packaged_draft("base"), base_pair.target.source)
    assert entry is not None and entry.read() is None
    fresh = load_draft(packaged_draft("base"), base_pair.target, base_pair.dtype, base_pair.device)
    assert not entry.write(fresh.quantize_int8().int8_rows())
