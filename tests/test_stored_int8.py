"""A distilled draft's int8 rows, stored by the first load and read by later ones
(`specasr.models.stored_int8`): the same rows, so the same draft; keyed by what they were made from."""

from __future__ import annotations

import shutil

import pytest
import torch

from specasr.backends.cpu import fused
from specasr.backends.cpu import linear as L
from specasr.models.draft import load_draft
from specasr.models.loading import load_pair, packaged_draft
from specasr.models.stored_int8 import HEAD, StoredInt8

pytestmark = pytest.mark.skipif(not L.int8_available(), reason="this torch build has no fbgemm int8 linear")


def _same_rows(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and HEAD in a and len(a) > 1
    for name in a:
        assert a[name].keys() == b[name].keys(), name
        assert all(torch.equal(a[name][f], b[name][f]) for f in a[name]), name


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
    assert rows[HEAD]["q"].shape == (len(fresh.vocab_ids), t.config.d_model)
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


# -- an int8 target (compute_type="int8") -------------------------------------------------------


def _int8_target_outputs(pair, mel) -> tuple[torch.Tensor, torch.Tensor]:
    """(encoder states [1, 1500, d], logits [1, 4, V] of a prompt): every stored form's product."""
    from specasr.decode.runners import make_runner

    states, _ = pair.encode(mel)
    with torch.inference_mode():
        logits = make_runner(pair.target, states)(torch.tensor([[50258, 50259, 50359, 50363]]), 4)
    return states, logits


@pytest.mark.skipif(not fused.Int8Rows.runs(512), reason="the compiled library does not run here")
def test_an_int8_target_read_from_its_entry_is_the_one_quantised_afresh(base_pair, tmp_path, monkeypatch):
    """The head (library blocks), the decoder's products (fbgemm's, packed from stored rows) and
    the once-per-window products: stored by the first load, read by the next, which quantises
    nothing and computes bitwise what the first computes. A product whose stored tensors do not
    fit is quantised afresh, and the entry is written again with it."""
    monkeypatch.setenv("SPECASR_CACHE", str(tmp_path))
    calls = []
    quantize = L._quantize_rows
    monkeypatch.setattr(L, "_quantize_rows", lambda *a: calls.append(1) or quantize(*a))
    source = str(base_pair.target.source)
    mel = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(1))

    first = load_pair(source, None, device="cpu", compute_type="int8")
    made = len(calls)
    (path,) = (tmp_path / "int8").glob("target-*.safetensors")
    entry = StoredInt8(path)
    forms = entry.read()
    assert made == len(forms) and HEAD in forms  # head, 6 x 6 decoder products, 36 encoder, 12 K/V
    assert {"model.encoder.layers.0.fc1", "model.decoder.layers.5.encoder_attn.v_proj"} <= forms.keys()
    assert "model.decoder.layers.0.self_attn.qkv_proj" in forms
    expect = _int8_target_outputs(first, mel)

    second = load_pair(source, None, device="cpu", compute_type="int8")
    assert len(calls) == made  # read, not quantised
    for a, b in zip(expect, _int8_target_outputs(second, mel)):
        assert torch.equal(a, b)

    bad = "model.encoder.layers.2.self_attn.k_proj"
    forms[bad]["w"] = forms[bad]["w"][:-1]  # a block short: not this product
    del forms["model.decoder.layers.3.fc2"]  # and one missing, as an int8_bfloat16 load leaves the window
    assert entry.write(forms)
    third = load_pair(source, None, device="cpu", compute_type="int8")
    assert len(calls) == made + 2  # those two only
    for a, b in zip(expect, _int8_target_outputs(third, mel)):
        assert torch.equal(a, b)
    again = entry.read()
    assert again.keys() == StoredInt8(path).read().keys() and len(again) == made  # written whole again
    assert torch.equal(again[bad]["w"], first.target.model.encoder.layers[2].self_attn.k_proj.rows.w)
