"""The distilled-draft module: lean runner equals the target's maths, reduced vocabulary,
files, loading, and exactness of speculative decoding with a reduced-vocabulary draft."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from hf_oracle import hf_logits
from tiny_pairs import random_tiny_pair

from specasr.backends.cpu.linear import Int8Linear, TransposedLinear, WideLinear, int8_available
from specasr.decode.loop import decode
from specasr.decode.runners import PromptTail, make_runner
from specasr.decode.step import Hooks
from specasr.models.draft import DistilledDraft, is_draft_file, load_draft
from specasr.options import DecodeOptions
from specasr.runtime.runner import LeanDecoder, LeanRunner, lean_decoder


@pytest.fixture(scope="module")
def tiny():
    return random_tiny_pair(seed=3)


def _states(pair, seed=0):
    g = torch.Generator().manual_seed(seed)
    mel = torch.randn(2, 80, 3000, generator=g)
    return pair.encode(mel)[0]  # [2, 1500, 64]


def test_full_copy_reproduces_the_target_incrementally_and_teacher_forced(tiny):
    t = tiny.target
    V = t.config.vocab_size
    draft = DistilledDraft.from_target(t, tuple(range(t.config.decoder_layers)), torch.arange(V)).attach(t)
    states = _states(tiny)
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 440, 2068, 3699, 264, 13]] * 2)
    with torch.inference_mode():
        ref = hf_logits(t, tiny.tokenizer, states, tokens)  # [2, 9, V], the reference implementation
        runner = draft.runner(states)
        parts = [runner(tokens[:, :4], 4), runner(tokens[:, 4:5], 1), runner(tokens[:, 5:], 4)]
        forced = draft(tokens, draft.cross_kv(states))
    torch.testing.assert_close(torch.cat(parts, 1), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(forced, ref, rtol=1e-4, atol=1e-4)


def test_reduced_vocabulary_rollback_and_keep(tiny):
    t = tiny.target
    ids = torch.tensor(sorted({tiny.tokenizer.eot, *range(0, 3000, 3), *range(50364, 51865)}))
    draft = DistilledDraft.from_target(t, (0,), ids).attach(t)
    states = _states(tiny, 1)
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 440, 2068], [50258, 50259, 50359, 50363, 11, 12]])
    with torch.inference_mode():
        fresh = draft.runner(states)(tokens, 6)
        r = draft.runner(states)
        r(tokens[:, :5], 1)
        r(torch.tensor([[7], [8]]), 1)  # a rejected proposal ...
        r.rollback(5)  # ... rolled back
        again = r(tokens[:, 5:], 1)
        r.keep(torch.tensor([1]))
        r.rollback(4)
        row1 = r(tokens[1:, 4:], 2)
    torch.testing.assert_close(again, fresh[:, 5:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(row1, fresh[1:, 4:], rtol=1e-5, atol=1e-5)
    outside = torch.ones(fresh.shape[-1], dtype=torch.bool)
    outside[ids] = False
    assert torch.isneginf(fresh[..., outside]).all()
    assert torch.isfinite(fresh[..., ids]).all()


def test_save_load_round_trip_and_refusals(tiny, tmp_path):
    t = tiny.target
    ids = torch.arange(0, 51865, 7)
    draft = DistilledDraft.from_target(t, (1, 0), ids).attach(t)
    path = tmp_path / "d.safetensors"
    draft.save(path, target="random")
    assert is_draft_file(path)
    loaded = load_draft(path, t, torch.float32, torch.device("cpu"))
    assert loaded.meta["target"] == "random" and loaded.meta["init_layers"] == "1,0"
    assert torch.equal(loaded.vocab_ids, ids)
    states = _states(tiny, 2)
    tokens = torch.tensor([[50258, 50259, 50359, 50363]] * 2)
    with torch.inference_mode():
        a, b = draft.runner(states)(tokens, 4), loaded.runner(states)(tokens, 4)
    torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)  # weights stored in fp16
    other = random_tiny_pair(seed=5).target
    other.config.d_model = 80
    with pytest.raises(ValueError, match="d_model"):
        loaded.attach(other)
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    assert not is_draft_file(tmp_path / "plain.safetensors")
    with pytest.raises(ValueError, match="not a specasr draft"):
        load_draft(tmp_path / "plain.safetensors", t, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("timestamps", [False, True])
def test_speculative_with_reduced_vocabulary_draft_is_exact(tiny, timestamps):
    """A random draft whose vocabulary misses most of the target's choices: every miss is a
    rejection, and the output must still equal target-only greedy decoding."""
    t = tiny.target
    ids = torch.tensor(sorted({tiny.tokenizer.eot, *range(0, 51865, 2)}))
    pair = replace(tiny, draft=DistilledDraft.from_target(t, (0,), ids).attach(t), shared_encoder=True)
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(4))
    opts = DecodeOptions(
        draft_stop=0.0, mode="exact", timestamps=timestamps, max_new_tokens=40, gamma_policy="fixed", gamma=3
    )
    ar = decode(pair, mel, replace(opts, mode="autoregressive"))
    for mode in ("baseline", "exact"):
        spec = decode(pair, mel, replace(opts, mode=mode))
        assert [r.tokens for r in spec] == [r.tokens for r in ar]
        assert spec[0].stats.proposed > 0


def test_reduced_rows_propose_what_full_rows_propose(tiny, monkeypatch):
    """The loop keeps a distilled draft's rows over its own vocabulary (`LeanRunner.vocab`);
    at T = 0 with timestamps and the confidence stop, every proposal, stop and acceptance
    equals the full-row path's (a draft whose vocab_ids are not ascending takes it)."""
    t = tiny.target
    ids = torch.tensor(sorted({tiny.tokenizer.eot, *range(0, 51865, 2)}))
    pair = replace(tiny, draft=DistilledDraft.from_target(t, (0,), ids).attach(t), shared_encoder=True)
    assert pair.draft.reduced_vocab == ids.tolist()
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(4))
    opts = DecodeOptions(mode="exact", timestamps=True, max_new_tokens=40, draft_stop=0.6)

    def run():
        seen = []
        hooks = Hooks(on_pass=lambda p: seen.append((p.proposal.tokens, p.accepted)))
        res = decode(pair, mel, opts, hooks=hooks)
        return [r.tokens for r in res], seen, res[0].stats.draft_stops

    reduced = run()
    monkeypatch.setattr(DistilledDraft, "reduced_vocab", property(lambda self: None))
    full = run()
    assert reduced == full and len(reduced[1]) > 3


def test_a_perfect_draft_is_never_rejected_and_per_token_alpha_is_one(tiny):
    """A full copy of the target as the draft: every reached proposal is accepted, so the
    per-token α̂ is 1 while accepted / proposed stays below 1 only through end-of-text cuts."""
    t = tiny.target
    draft = DistilledDraft.from_target(t, tuple(range(t.config.decoder_layers)), torch.arange(51865))
    pair = replace(tiny, draft=draft.attach(t), shared_encoder=True)
    mel = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(9))
    opts = DecodeOptions(draft_stop=0.0, mode="exact", max_new_tokens=30, gamma_policy="fixed", gamma=4)
    st = decode(pair, mel, opts)[0].stats
    assert st.accepted > 0 and st.rejected == 0 and st.token_acceptance == 1.0
    assert st.tokens_per_target_call > 3.0


def test_lean_decoder_is_the_transformers_decoder(tiny):
    """`LeanRunner` over `LeanDecoder` (the target's CPU runner) gives the Hugging Face
    decoder's logits in blocks of any size, through rollback and keep."""
    t = tiny.target
    assert LeanDecoder.supports(t) and not LeanDecoder.supports(copy.deepcopy(t).half())
    states = _states(tiny, 2)
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 440, 2068, 3699, 264, 13]] * 2)
    with torch.inference_mode():
        ref = hf_logits(t, tiny.tokenizer, states, tokens)  # [2, 9, V], the reference implementation
        r = make_runner(t, states)
        assert isinstance(r, LeanRunner) and lean_decoder(t) is lean_decoder(t)
        parts = [r(tokens[:, :4], 4), r(tokens[:, 4:5], 1)]
        r(torch.tensor([[7, 8, 9]] * 2), 3)  # rejected proposals ...
        r.rollback(5)  # ... rolled back
        parts.append(r(tokens[:, 5:], 4))
        r.keep(torch.tensor([1]))
        r.rollback(6)
        row1 = r(tokens[1:, 6:], 3)
    torch.testing.assert_close(torch.cat(parts, 1), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(row1, ref[1:, 6:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 5, 9])
def test_cpu_linear_forms_compute_the_product(rows):
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(3001, 64, generator=g), torch.randn(3001, generator=g)
    x = torch.randn(2, rows, 64, generator=g)
    torch.testing.assert_close(TransposedLinear(w, b)(x), F.linear(x, w, b), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(WideLinear(w)(x), F.linear(x, w), rtol=1e-5, atol=1e-4)
    if int8_available():  # lossy: per-row int8 weights, per-call int8 activations
        y, ref = Int8Linear(w, b)(x), F.linear(x, w, b)
        assert y.shape == ref.shape and (y - ref).abs().max() < 0.05 * ref.abs().max()


@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 linear")
def test_int8_draft_stays_exact(tiny):
    """An int8 draft proposes almost the same tokens; decoding stays the target's."""
    t = tiny.target
    ids = torch.arange(t.config.vocab_size)
    draft = DistilledDraft.from_target(t, (0, 1), ids).attach(t)
    states = _states(tiny, 4)
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 440, 2068, 3699, 264, 13]] * 2)
    with torch.inference_mode():
        full = draft.runner(states)(tokens, 9)
        quant = copy.deepcopy(draft).attach(t).quantize_int8().runner(states)(tokens, 9)
    assert (quant.argmax(-1) == full.argmax(-1)).float().mean() > 0.8
    assert not torch.equal(quant, full)  # it really runs the int8 products
    pair = replace(tiny, draft=copy.deepcopy(draft).attach(t).quantize_int8(), shared_encoder=True)
    mel = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(5))
    opts = DecodeOptions(draft_stop=0.0, mode="exact", gamma=4, gamma_policy="fixed", max_new_tokens=20)
    spec, ar = decode(pair, mel, opts)[0], decode(pair, mel, replace(opts, mode="autoregressive"))[0]
    assert spec.tokens == ar.tokens and spec.stats.accepted > 0


@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 linear")
def test_an_int8_draft_with_bf16_cross_kv_stays_exact_and_close(tiny, monkeypatch):
    """`quantize_int8(bf16_cross=True)`: the runner holds the (pooled) cross K/V in bf16, the
    logits stay close to the fp32 K/V's and move (it really reads bf16), and speculative
    decoding keeps the target's tokens. The default follows the CPU (`bf16.available`)."""
    from specasr.backends.cpu import bf16

    t = tiny.target
    draft = _pooled_draft(tiny, 2)
    states = _states(tiny, 4)[:1]  # one row: the K/V in bf16 (a batch's rows keep fp32, below)
    two = states.expand(2, -1, -1).contiguous()  # alike: a draft quantises a call's rows together
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 440, 2068, 3699, 264, 13]])
    drafts = {on: copy.deepcopy(draft).attach(t).quantize_int8(bf16_cross=on) for on in (False, True)}
    with torch.inference_mode():
        target = make_runner(t, states)
        logits = {}
        for on, d in drafts.items():
            runner = d.runner(states, target.plain_cross())
            assert {x.dtype for kv in runner.cross for x in kv} == {torch.bfloat16 if on else torch.float32}
            logits[on] = runner(tokens, 9)
        batch = drafts[True].runner(two, make_runner(t, two).plain_cross())
        assert {x.dtype for kv in batch.cross for x in kv} == {torch.float32}  # the torch path's rows
        batch.keep([1])  # one row left: bf16, as a runner made for that row holds them
        assert {x.dtype for kv in batch.cross for x in kv} == {torch.bfloat16}
        assert torch.equal(batch(tokens, 9), logits[True])
    assert not torch.equal(logits[True], logits[False])
    torch.testing.assert_close(logits[True], logits[False], rtol=0.05, atol=0.05)
    pair = replace(tiny, draft=drafts[True], shared_encoder=True)
    mel = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(5))
    opts = DecodeOptions(draft_stop=0.0, mode="exact", gamma=4, gamma_policy="fixed", max_new_tokens=20)
    spec, ar = decode(pair, mel, opts)[0], decode(pair, mel, replace(opts, mode="autoregressive"))[0]
    assert spec.tokens == ar.tokens and spec.stats.accepted > 0
    with torch.inference_mode():  # unquantised: K/V kept in the dtype they come in (fp16 on CUDA)
        given = [(k.to(torch.bfloat16), v.to(torch.bfloat16)) for k, v in target.plain_cross()]
        plain = copy.deepcopy(draft).attach(t).runner(states, given)
    held = [{x.dtype for x in kv} for kv in plain.cross]  # layer 0 shares the target's; layer 1 its own
    assert draft.cross_dtype is None and held == [{torch.bfloat16}, {torch.float32}]
    for native in (False, True):
        monkeypatch.setattr(bf16, "available", lambda native=native: native)
        d = copy.deepcopy(draft).attach(t).quantize_int8()
        assert d.cross_dtype == (torch.bfloat16 if native else torch.float32)


@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 linear")
def test_int8_draft_fuses_qkv_into_one_product_with_the_same_result(tiny):
    t = tiny.target
    draft = DistilledDraft.from_target(t, (0, 1), torch.arange(t.config.vocab_size)).attach(t)
    attn = draft.layers[0].self_attn
    apart = [Int8Linear.of(getattr(attn, name)) for name in ("q_proj", "k_proj", "v_proj")]
    quant = copy.deepcopy(draft).attach(t).quantize_int8()
    fused = quant.layers[0].self_attn
    assert not hasattr(fused, "q_proj") and isinstance(fused.qkv_proj, Int8Linear)
    x = torch.randn(2, 3, t.config.d_model, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        for mine, ref in zip(fused.qkv_proj(x).chunk(3, dim=-1), (lin(x) for lin in apart)):
            torch.testing.assert_close(mine, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 linear")
@pytest.mark.parametrize("bf16_cross", [False, True])
def test_scripted_int8_step_is_bitwise_the_eager_layer(tiny, bf16_cross):
    """`layer_steps`: blocks and one-token steps through the scripted layer give exactly
    the eager int8 layer's logits, across cache writes, a rollback and rewriting the cache,
    with the cross K/V in fp32 and in bf16 (`DistilledDraft.cross_dtype`)."""
    t = tiny.target
    draft = DistilledDraft.from_target(t, (0, 1), torch.arange(t.config.vocab_size)).attach(t)
    eager = copy.deepcopy(draft).attach(t).quantize_int8(script=False, bf16_cross=bf16_cross)
    scripted = copy.deepcopy(draft).attach(t).quantize_int8(bf16_cross=bf16_cross)
    assert eager.form.name == "eager" and scripted.form.name == "scripted-int8"
    states = _states(tiny, 7)
    if bf16_cross:  # bf16 K/V are one row's (the C step's bytes); a batch's rows keep fp32
        states = states[:1]
    B = states.shape[0]
    prefix = torch.tensor([[50258, 50259, 50359, 50363, 440]] * B)
    runs = []
    with torch.inference_mode():
        for d in (eager, scripted):
            runner = d.runner(states)
            runner._fused = None  # this test is the scripted layer's: no C step for one row
            held = {t.dtype for kv in runner.cross for t in kv}
            assert held == {torch.bfloat16 if bf16_cross else torch.float32}
            out = [runner(prefix, 1)]
            out += [runner(torch.tensor([[tok], [tok + 1]][:B]), 1) for tok in (2068, 3699, 264)]
            runner.rollback(6)  # drop the last two: the next step rewrites their cache slots
            out += [runner(torch.tensor([[13], [11]][:B]), 1), runner(torch.tensor([[50257]] * B), 1)]
            out.append(runner(torch.tensor([[291, 300, 257]] * B), 3))  # a 3-token block (masked)
            runs.append(torch.cat(out, dim=1))  # [B, 9, V]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[1][:, 3], runs[1][:, 4])  # the steps really differ


@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 linear")
def test_a_cached_compilation_is_the_same_graph_and_a_bad_one_is_recompiled(tiny, tmp_path, monkeypatch):
    """`scripted` caches its compilation (a fresh process loads it instead of compiling):
    the loaded step gives bitwise the logits of a fresh compilation; a corrupt entry is
    compiled afresh and rewritten."""
    from specasr.backends.cpu import scripted as S

    monkeypatch.setenv("SPECASR_CACHE", str(tmp_path))
    t = tiny.target
    draft = DistilledDraft.from_target(t, (0, 1), torch.arange(t.config.vocab_size)).attach(t)
    states = _states(tiny, 3)
    prefix = torch.tensor([[50258, 50259, 50359, 50363, 440]] * 2)

    def logits() -> tuple[str, torch.Tensor]:
        S.scripted.cache_clear()  # as a fresh process
        d = copy.deepcopy(draft).attach(t).quantize_int8()
        with torch.inference_mode():
            runner = d.runner(states)
            out = [runner(prefix, 1), runner(torch.tensor([[2068], [3699]]), 1)]
        return type(runner.steps[0].fn).__name__, torch.cat(out, dim=1)

    try:
        kinds, runs = zip(*(logits() for _ in range(2)))
        assert kinds == ("ScriptFunction", "ScriptMethod")  # compiled and stored, then loaded
        assert torch.equal(runs[0], runs[1])
        (entry,) = (tmp_path / "scripted").glob("int8-*.pt")
        entry.write_bytes(b"not a TorchScript archive")
        kind, again = logits()
        assert kind == "ScriptFunction" and torch.equal(again, runs[0])
        torch.jit.load(str(entry))  # rewritten whole
    finally:
        S.scripted.cache_clear()


def test_scripted_target_layers_match_the_eager_lean_decoder(base_pair):
    """`layer_steps.fp32_layer_step`: the target's scripted passes (up to MANY_ROWS rows)
    agree with the eager LeanDecoder layers, and blocks above that stay eager. On base's
    real weights: a random tiny model's logits are too small to show a wrong scale."""
    from specasr.backends.cpu.linear import MANY_ROWS

    t = base_pair.target
    eager, scripted = LeanDecoder(t, script=False), LeanDecoder(t)
    assert eager.form.name == "eager" and scripted.steps[0].max_rows == MANY_ROWS
    mel = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(8))
    states = base_pair.encode(mel)[0]  # [1, 1500, 512]
    long = torch.tensor([[50258, 50259, 50359, 50363] + [440, 291] * 30])  # 64 tokens: scripted
    steps = [[2068], [3699, 264, 13], [11], [50257, 11, 12, 13, 14, 15, 16]]
    outs = []
    with torch.inference_mode():
        for dec in (eager, scripted):
            runner = LeanRunner(dec, states[:1])
            out = [runner(long, 64)]
            out += [runner(torch.tensor([s]), len(s)) for s in steps]
            runner.rollback(66)  # rejected proposals: rewrite their cache slots
            out.append(runner(torch.tensor([[7, 8]]), 2))
            outs.append(torch.cat(out, dim=1))  # [1, 64 + 12 + 2, V]
    # logits of size ~10: summation order moves them by up to ~3e-4 on some CPUs; a 0.1% wrong
    # scale would move them by ~1e-2
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-3)
    assert torch.equal(outs[1].argmax(-1), outs[0].argmax(-1))
    with torch.inference_mode():  # above MANY_ROWS rows the scripted decoder runs its eager layers
        big = torch.tensor([[50258, 50259, 50359, 50363] + [440] * 70])  # 74 rows
        a, b = LeanRunner(eager, states[:1])(big, 74), LeanRunner(scripted, states[:1])(big, 74)
    assert torch.equal(a, b)


def test_draft_reuses_the_targets_cross_kv_where_it_kept_the_projections(tiny):
    t = tiny.target
    draft = DistilledDraft.from_target(t, (0, 1), torch.arange(t.config.vocab_size))
    with torch.no_grad():
        draft.layers[1].encoder_attn.v_proj.bias.add_(1e-3)  # as if trained: not the target's any more
    draft.attach(t)
    assert draft.cross_from == [0, None]
    states = _states(tiny, 6)
    target = make_runner(t, states)
    runner = make_runner(draft, states, target)
    assert all(a is b for a, b in zip(runner.cross[0], target.cross[0]))  # the same K, V tensors
    assert not any(a is b for a, b in zip(runner.cross[1], target.cross[1]))
    own = draft.runner(states).cross
    torch.testing.assert_close(runner.cross[0], own[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(runner.cross[1][1], target.cross[1][1])


def test_a_self_draft_shares_its_targets_derived_weights(tiny):
    """`self:K` reuses the target's modules, so its CPU view reuses their transposed and
    packed copies instead of building a second set."""
    from specasr.models.loading import self_draft

    t = tiny.target
    draft = self_draft(t, 1)
    mine, theirs = lean_decoder(draft), lean_decoder(t)
    assert mine is not theirs and mine.head is theirs.head
    assert mine.layers[0].fc1 is theirs.layers[0].fc1


def test_a_draft_reading_the_prompts_tail_stays_exact(tiny):
    """`DecodeOptions.draft_prompt`: the draft reads <|startofprev|> and the prompt's last
    tokens only (`PromptTail`), its positions `drop` behind the target's; the output at T = 0
    is still the target's greedy one, in a batch, with timestamps and the stop."""
    t = tiny.target
    ids = torch.tensor(sorted({tiny.tokenizer.eot, *range(0, 51865, 2)}))
    pair = replace(tiny, draft=DistilledDraft.from_target(t, (0,), ids).attach(t), shared_encoder=True)
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(5))
    prompt = torch.randint(0, 50000, (40,), generator=torch.Generator().manual_seed(6)).tolist()
    opts = DecodeOptions(mode="exact", timestamps=True, max_new_tokens=30, draft_prompt=8)
    seen = []

    def check(p):
        assert isinstance(p.draft, PromptTail) and p.draft.drop == 40 - 8
        held = [n - p.draft.drop for n in p.draft.lengths]
        assert held == p.draft.inner.lengths and all(
            n <= m for n, m in zip(p.draft.lengths, p.target.lengths)
        )
        seen.append(p)

    ar = decode(pair, mel, replace(opts, mode="autoregressive"), prompt=prompt)
    spec = decode(pair, mel, opts, prompt=prompt, hooks=Hooks(on_pass=check))
    assert [r.tokens for r in spec] == [r.tokens for r in ar] and seen
    whole = decode(
        pair, mel, replace(opts, draft_prompt=None), prompt=prompt, hooks=Hooks(on_pass=seen.append)
    )
    assert [r.tokens for r in whole] == [r.tokens for r in ar] and not isinstance(seen[-1].draft, PromptTail)


def test_prompt_tail_feeds_the_draft_its_own_shorter_sequence(tiny):
    """A PromptTail's first pass drops prompt tokens 1 … drop; its logits equal the inner
    runner's on that shorter sequence, and later passes and rollbacks map positions by drop."""
    t = tiny.target
    draft = DistilledDraft.from_target(t, (0,), torch.arange(51865)).attach(t)
    states = _states(tiny)
    ctx = torch.randint(0, 50000, (2, 12), generator=torch.Generator().manual_seed(7))
    ctx[:, 0] = tiny.tokenizer.sot_prev
    tail = PromptTail(draft.runner(states), drop=5)
    assert tail.lengths == [0, 0]
    got = tail(ctx, 3)
    short = torch.cat([ctx[:, :1], ctx[:, 6:]], dim=1)  # [2, 7]
    ref = draft.runner(states)
    assert torch.equal(got, ref(short, 3)) and tail.lengths == [12, 12]
    tail.rollback([10, 11])  # ragged, in context positions
    assert tail.inner.lengths == [5, 6] and tail.lengths == [10, 11]
    ref.rollback([5, 6])
    step = torch.tensor([[ctx[0, 10]], [ctx[1, 11]]])  # each row's next context token
    assert torch.equal(tail(step, 1), ref(step, 1))


def _pooled_draft(tiny, pool: int) -> DistilledDraft:
    t = tiny.target
    ids = torch.tensor(sorted({tiny.tokenizer.eot, *range(0, 51865, 3)}))
    draft = DistilledDraft.from_target(t, (0, 1), ids)
    with torch.no_grad():
        draft.layers[1].encoder_attn.v_proj.bias.add_(1e-3)  # its own K/V in layer 1; layer 0 shares
        for layer in draft.layers:  # peaked attention (a random tiny layer's is nearly uniform,
            layer.encoder_attn.q_proj.weight.mul_(30.0)  # and means of uniform weights are no test)
    draft.cross_pool = pool
    return draft.attach(t)


def test_a_pooled_draft_attends_over_the_means_of_adjacent_frames(tiny):
    """`cross_pool`: each draft layer's K and V become the means of p adjacent frames, 1500 / p
    rows, whether they are its own or the target's shared ones; the cached runner and the
    teacher-forced pass (training) see the same pooled rows."""
    draft = _pooled_draft(tiny, 3)
    assert draft.cross_from == [0, None]
    states = _states(tiny, 7)
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 440, 2068, 3699]] * 2)
    target = make_runner(tiny.target, states)
    runner = make_runner(draft, states, target)
    with torch.inference_mode():
        full = draft.cross_kv(states)
    for (k, v), (pk, pv) in zip(full, runner.cross):
        assert pk.shape == (2, k.shape[1], 500, k.shape[3]) and pk.is_contiguous()
        torch.testing.assert_close(pk[:, :, 7], k[:, :, 21:24].mean(2), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pv[:, :, 499], v[:, :, 1497:].mean(2), rtol=1e-5, atol=1e-6)
    with torch.inference_mode():
        first = runner(tokens[:, :4], 4, reduced=True)
        stepped = torch.cat([first, runner(tokens[:, 4:], 3, reduced=True)], 1)
        forced = draft(tokens, full)  # pools what it is given
        unpooled = replace_pool(draft, 1)(tokens, full)
    torch.testing.assert_close(stepped, forced, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(forced, unpooled, rtol=1e-3, atol=1e-3)  # pooling changed what it sees
    with pytest.raises(ValueError, match="do not pool by 7"):
        replace_pool(draft, 7).pool_cross(*full[0])


def test_pooling_by_two_gives_the_bits_of_the_mean_for_any_layout(tiny):
    """`pool_cross` at p = 2 adds the even and odd frames and halves (fast, above all for a K
    that is a view of an int8 target's Kᵀ): bitwise the mean over the pairs, for a shared
    K given transposed and for contiguous K and V, over two rows."""
    draft = _pooled_draft(tiny, 2)
    g = torch.Generator().manual_seed(11)
    kt = torch.randn(2, 4, 16, 1500, generator=g)  # Kᵀ [B, H, dh, S], as a fixed-rows target holds it
    v = torch.randn(2, 4, 1500, 16, generator=g)
    for k in (kt.transpose(2, 3), kt.transpose(2, 3).contiguous()):
        pk, pv = draft.pool_cross(k, v)
        assert pk.is_contiguous() and pv.is_contiguous() and pk.shape == (2, 4, 750, 16)
        assert torch.equal(pk, k.unflatten(2, (750, 2)).mean(3))
        assert torch.equal(pv, v.unflatten(2, (750, 2)).mean(3))


def replace_pool(draft: DistilledDraft, pool: int) -> DistilledDraft:
    other = copy.copy(draft)  # the same modules, another pooling
    other.cross_pool = pool
    return other


def test_a_pooled_draft_is_saved_loaded_and_stays_exact(tiny, tmp_path):
    draft = _pooled_draft(tiny, 2)
    path = tmp_path / "pooled.safetensors"
    draft.save(path, target="random")
    loaded = load_draft(path, tiny.target, torch.float32, torch.device("cpu"))
    assert loaded.cross_pool == 2
    plain = tmp_path / "plain.safetensors"
    replace_pool(draft, 1).save(plain, target="random")
    assert load_draft(plain, tiny.target, torch.float32, torch.device("cpu")).cross_pool == 1
    pair = replace(tiny, draft=loaded, shared_encoder=True)
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(8))
    opts = DecodeOptions(mode="exact", timestamps=True, max_new_tokens=40, gamma_policy="fixed", gamma=4)
    ar = decode(pair, mel, replace(opts, mode="autoregressive"))
    spec = decode(pair, mel, opts)
    assert [r.tokens for r in spec] == [r.tokens for r in ar]
    assert spec[0].stats.proposed > 0
