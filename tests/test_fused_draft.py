"""The distilled draft's fused one-token step (`specasr.backends.cpu.fused`, `draft_step.cpp`) on the
packaged draft and base: it computes the torch int8 path's function (the same proposals
almost always, logits within int8 rounding), shares the runner's cache with that path, and
stays out of the way where it cannot run, or where the library and the module disagree on
their ABI; built by torch.utils.cpp_extension, it runs on torch's one OpenMP runtime."""

from __future__ import annotations

import ctypes
import functools
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from specasr.backends.cpu import fused
from specasr.backends.cpu.linear import int8_available
from specasr.decode.loop import decode
from specasr.decode.runners import make_runner
from specasr.options import DecodeOptions

# fbgemm's int8 products are the torch path it stands in for; a C++ compiler and ninja are test
# requirements (the README's test command installs gcc, ninja is a dependency), so their absence
# fails here
pytestmark = pytest.mark.skipif(not int8_available(), reason="needs fbgemm (x86-64 torch)")


def test_the_library_builds_here():
    assert fused.library() is not None, "no C++ compiler or ninja, or draft_step.cpp did not compile"


@pytest.fixture(scope="module")
def draft(base_pair):
    from specasr.models.draft import load_draft
    from specasr.models.loading import packaged_draft

    d = load_draft(packaged_draft("base"), base_pair.target, base_pair.dtype, base_pair.device)
    return d.quantize_int8()


@pytest.fixture(scope="module")
def window(base_pair, librivox, librivox_mels):
    """A real window: encoder states [1, 1500, d] and the target's own greedy tokens."""
    mel = librivox_mels[librivox[0].id]
    states, _ = base_pair.encode(mel)
    result = decode(base_pair, mel, DecodeOptions(mode="autoregressive"))[0]
    return states, result.tokens


def _runners(base_pair, draft, states):
    target = make_runner(base_pair.target, states)
    return make_runner(draft, states, target), make_runner(draft, states, target)


def _prompt(base_pair) -> list[int]:
    return base_pair.tokenizer.sot_sequence("en")  # sot, en, transcribe, no timestamps


def test_the_fused_step_proposes_what_the_torch_path_proposes(base_pair, draft, window):
    states, tokens = window
    assert draft.fused is not None
    fast, slow = _runners(base_pair, draft, states)
    slow._fused = None  # the torch int8 path throughout
    assert fast._fused is not None
    prompt = torch.tensor([_prompt(base_pair)])
    a, b = fast(prompt, 1, reduced=True), slow(prompt, 1, reduced=True)  # 4 tokens: fused too
    agree, n = 0, 0
    for tok in tokens:
        x = torch.tensor([[tok]])
        a, b = fast(x, 1, reduced=True), slow(x, 1, reduced=True)  # [1, 1, N]
        assert a.shape == b.shape == (1, 1, len(draft.vocab_ids))
        corr = torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1]
        assert corr > 0.99, (n, float(corr))
        agree += int(a.argmax() == b.argmax())
        n += 1
    assert n >= 20 and agree / n >= 0.95, (agree, n)
    assert fast.lengths == slow.lengths == [len(tokens) + 4]
    # the keys and values each path wrote for every position: the same within int8 rounding
    for K, L in zip(fast.k + fast.v, slow.k + slow.v):
        p = fast.lengths[0]
        err = (K[:, :, :p] - L[:, :, :p]).abs().max() / L[:, :, :p].abs().max()
        # fbgemm and the C step quantise the inputs on different grids (per call, per row) and
        # round differently where the CPU has no VNNI: a few int8 steps of the largest value
        assert err < 0.08, float(err)


def test_fed_tokens_and_torch_passes_share_one_cache(base_pair, draft, window):
    states, tokens = window
    one, two = _runners(base_pair, draft, states)
    prompt = torch.tensor([_prompt(base_pair) + tokens[:8]])  # 12 tokens: a torch pass
    one(prompt, 1, reduced=True), two(prompt, 1, reduced=True)
    for tok in tokens[8:10]:  # one call per token …
        x = one(torch.tensor([[tok]]), 1, reduced=True)
    y = two(torch.tensor([tokens[8:10]]), 1, reduced=True)  # … or two tokens in one feed: the same calls
    assert torch.equal(x, y)
    # a torch pass over 6 more tokens reads the keys and values the fused steps wrote
    x = one(torch.tensor([tokens[10:16]]), 1, reduced=True)
    three = make_runner(draft, states, make_runner(base_pair.target, states))
    three._fused = None
    three(prompt, 1, reduced=True)
    y = three(torch.tensor([tokens[8:16]]), 1, reduced=True)  # positions 12 … 19 by torch alone
    assert one.lengths == three.lengths == [20]
    for K, L in zip(one.k + one.v, three.k + three.v):
        err = (K[:, :, 12:14] - L[:, :, 12:14]).abs().max() / L[:, :, 12:14].abs().max()
        assert err < 0.15, float(err)  # int8 rounding through two layers; unwritten keys: 1
    assert torch.corrcoef(torch.stack([x.flatten(), y.flatten()]))[0, 1] > 0.99
    assert x.argmax() == y.argmax()


def test_one_row_only_and_never_past_the_context(base_pair, draft, window):
    states, tokens = window
    batch = make_runner(draft, states.expand(2, -1, -1).contiguous())
    assert batch._fused is None  # B = 2: the torch path
    single = make_runner(draft, states)
    assert single._fused is not None
    batch.keep([1])  # row 1 moves to 0; one row left: the C step again, over the moved tensors
    assert batch._fused is not None
    feed = torch.tensor([tokens[:3]])
    assert torch.equal(batch(feed, 1, reduced=True), single(feed, 1, reduced=True))
    state = make_runner(draft, states)._fused
    with pytest.raises(RuntimeError, match="position out of range.*position 448"):
        state.step([tokens[0]], 448)
    with pytest.raises(RuntimeError, match="token out of range"):
        state.step([51865], 3)  # one past base's vocabulary


def test_it_stays_off_without_a_compiler_or_when_turned_off(monkeypatch, tmp_path, draft):
    monkeypatch.setenv("SPECASR_FUSED_DRAFT", "0")
    assert fused.FusedDraft.of(draft) is None
    monkeypatch.delenv("SPECASR_FUSED_DRAFT")
    monkeypatch.setenv("SPECASR_CACHE", str(tmp_path))
    build = fused.library.__wrapped__  # uncached: a fresh look for a compiler
    monkeypatch.setattr(fused.shutil, "which", lambda name: None)
    assert build() is None
    monkeypatch.undo()
    monkeypatch.setenv("SPECASR_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a compiler that always fails
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert build() is None
    assert any("did not compile" in str(w.message) for w in caught)
    left = [p.suffix for p in (tmp_path / "fused").iterdir()]
    assert left == [".failed"]  # the compiler's message, kept; nothing half-built is left
    calls = []
    monkeypatch.setattr("torch.utils.cpp_extension.load", lambda *a, **k: calls.append(a))
    assert build() is None and calls == []  # a failed build is not tried again
    monkeypatch.undo()
    monkeypatch.setenv("SPECASR_CACHE", str(tmp_path))
    lib = build()  # and the real compiler builds it into this cache
    assert lib is not None and len(list((tmp_path / "fused").glob("*.so"))) == 1
    assert not list((tmp_path / "fused").glob(".build-*"))  # the builder's objects are gone


def test_a_library_of_another_abi_is_refused(monkeypatch, draft):
    """The library reports its ABI number and sizeof(Dims); where either differs from this
    module's, it warns and the draft keeps the torch path."""
    assert fused.library() is not None
    monkeypatch.setattr(fused, "ABI", fused.ABI + 1)
    monkeypatch.setattr(fused, "library", functools.cache(fused.library.__wrapped__))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fused.FusedDraft.of(draft) is None
    assert any(f"ABI is {fused.ABI - 1}, this module's {fused.ABI}" in str(w.message) for w in caught)
    monkeypatch.undo()

    class Wider(ctypes.Structure):
        _fields_ = [*fused._Dims._fields_, ("extra", ctypes.c_int32)]

    monkeypatch.setattr(fused, "_Dims", Wider)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fused.library.__wrapped__() is None
    assert any("Dims is" in str(w.message) for w in caught)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_one_openmp_runtime_is_mapped_with_the_library():
    """The library links the OpenMP runtime torch loaded (by its path), not the compiler's
    libgomp beside it: a process that loads both maps one runtime file."""
    script = textwrap.dedent(
        """
        import torch
        from specasr.backends.cpu import fused
        assert fused.library() is not None
        torch.ones(1 << 20).sum()  # torch's own parallel code, on its runtime
        for line in open("/proc/self/maps"):
            name = line.split()[-1].rsplit("/", 1)[-1]
            if name.startswith(("libgomp", "libiomp", "libomp")) and ".so" in name:
                print(line.split()[-1])
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    runtimes = set(done.stdout.split())  # a file maps several times (text, data, …)
    assert len(runtimes) == 1, runtimes


def test_the_int8_rows_are_quantised_once_and_not_held_twice(base_pair):
    """The fused step reads the int8 rows its `Int8Linear`s keep (`Int8Linear.kept_of`): the same
    tensors, quantised once. fbgemm's packed copy of them is made only by a pass that runs the
    torch path (its products bitwise those of a module packed at once), never by one-token
    steps; without the fused step each module holds fbgemm's copy alone."""
    from specasr.backends.cpu.linear import Int8Linear, _quantize_rows
    from specasr.models.draft import load_draft
    from specasr.models.loading import packaged_draft

    raw = load_draft(packaged_draft("base"), base_pair.target, base_pair.dtype, base_pair.device)
    q, _ = _quantize_rows(raw.layers[0].fc1.weight, 127)
    lazy = load_draft(packaged_draft("base"), base_pair.target, base_pair.dtype, base_pair.device)
    lazy.quantize_int8()
    read = {t.w.data_ptr() for t in lazy.fused.keep if isinstance(t, fused._Int8)}
    int8s = [m for m in lazy.modules() if isinstance(m, Int8Linear)] + [lazy._head_int8]
    steps = [lazy._head_int8] + [
        lin
        for layer in lazy.layers
        for lin in (layer.self_attn.qkv_proj, layer.self_attn.out_proj, layer.encoder_attn.q_proj)
        + (layer.encoder_attn.out_proj, layer.fc1, layer.fc2)
    ]
    assert {m.kept[0].data_ptr() for m in steps} == read  # the C step's rows are the modules' own
    assert torch.equal(lazy.layers[0].fc1.kept[0], q)
    states = torch.zeros(1, 1500, 512)  # its cross K/V the target's (`cross_from`), as in a decode
    runner = make_runner(lazy, states, make_runner(base_pair.target, states))
    runner(torch.tensor([[50258, 50259, 50359]]), 1, reduced=True)  # a window's start: the C step
    assert all(m._packed is None for m in int8s)  # no second copy
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(0))
    plain = raw.quantize_int8(fused=False)
    assert plain.fused is None and make_runner(plain, torch.zeros(1, 1500, 512))._fused is None
    assert all(m.kept is None and m._packed is not None for m in plain.modules() if isinstance(m, Int8Linear))
    assert torch.equal(lazy.layers[0].fc1(x), plain.layers[0].fc1(x))  # packed on first use: the same
    assert lazy.layers[0].fc1._packed is not None


# -- an int8 target's head: `fused.Int8Rows` -------------------------------------------------


@pytest.mark.parametrize("out", [51865, 4099, 16])  # base's head, and blocks of 16 with a tail or none
def test_the_int8_head_kernel_is_fbgemms_per_row_product_bitwise(out):
    from specasr.backends.cpu.linear import Int8Head, Int8Linear

    g = torch.Generator().manual_seed(out)
    table = torch.randn(out, 512, generator=g) * 0.05
    head = Int8Head(table, fused.Int8Rows.of)
    assert isinstance(head.rows, fused.Int8Rows)
    assert head.inner is None  # one int8 copy: the kernel's
    reference = Int8Linear(table, None, per_row=True)
    for rows in (1, 2, 3, 4, 5, 8, 9, 17, 72):  # every count the kernel unrolls, and blocks of them
        x = torch.randn(1, rows, 512, generator=g) * torch.rand(rows, 1, generator=g) * 8
        x[0, 0, :7] = 0.0  # exact zeros and ties to round: the zero point
        assert torch.equal(head(x), reference(x)), rows


def test_the_int8_head_kernel_gives_a_row_what_it_gives_it_alone():
    from specasr.backends.cpu.linear import Int8Head

    g = torch.Generator().manual_seed(7)
    head = Int8Head(torch.randn(1000, 64, generator=g), fused.Int8Rows.of)
    x = torch.randn(11, 64, generator=g)
    x[3] *= 1e4  # a row far larger than the others moves nothing but itself
    together = head(x)
    assert all(torch.equal(together[i], head(x[i : i + 1])[0]) for i in range(11))


@pytest.mark.parametrize("out", [512, 40])
def test_an_encoder_shaped_product_splits_its_frames_over_the_threads_without_changing_a_row(out):
    """1500 frames against few output blocks: the library splits the frames into chunks as well
    (integer sums, so no split moves a bit); still fbgemm's per-row product, and each frame
    what it gets alone."""
    from specasr.backends.cpu.linear import Int8Linear

    g = torch.Generator().manual_seed(out)
    weight = torch.randn(out, 512, generator=g) * 0.05
    reference = Int8Linear(weight, None, per_row=True, keep=True)
    rows = fused.Int8Rows.of(reference)
    x = torch.randn(1500, 512, generator=g) * torch.rand(1500, 1, generator=g) * 8
    together = rows(x)
    assert torch.equal(together, reference(x[None])[0])
    assert torch.equal(together[1000:1003], rows(x[1000:1003]))
    assert torch.equal(together[64:65], rows(x[64:65]))  # a chunk's first frame


def test_the_int8_head_falls_back_to_fbgemm_where_the_library_is_off(monkeypatch):
    from specasr.backends.cpu.linear import Int8Head, Int8Linear

    monkeypatch.setenv("SPECASR_FUSED_DRAFT", "0")
    table = torch.randn(100, 64)
    head = Int8Head(table, fused.Int8Rows.of)
    assert head.rows is None and head.inner.kept is None and head.inner._packed is not None
    x = torch.randn(3, 64)
    assert torch.equal(head(x), Int8Linear(table, None, per_row=True)(x))
