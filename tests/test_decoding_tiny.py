"""The speculative loop on random tiny models: exactness, batching, rollback, sampling."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest
import torch
from hf_oracle import hf_logits
from tiny_pairs import random_tiny_pair
from toy import TOY_FRAMES, toy_pair

from specasr import kernels
from specasr.decode import loop
from specasr.decode.filters import apply_filters, build_filters
from specasr.decode.loop import decode
from specasr.decode.runners import make_runner
from specasr.decode.step import Hooks, Pass
from specasr.decode.stop import confidence
from specasr.decode.task import start_sequence
from specasr.models.draft import DistilledDraft
from specasr.options import DecodeOptions
from specasr.runtime.runner import LeanDecoder

MAX_NEW = 40
# Random drafts are never confident, so the draft-confidence stop would end every run after one
# token: tests of γ and of the verify path turn it off (draft_stop=0.0) unless they test the stop.


@pytest.fixture(scope="module")
def tiny():
    return random_tiny_pair(seed=0, draft_layers=1)


def _mels(batch: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 80, 3000, generator=g)  # [B, 80, 3000]


@pytest.fixture(scope="module")
def ar_reference(tiny):
    mel = _mels(3)
    opts = DecodeOptions(mode="autoregressive", max_new_tokens=MAX_NEW)
    return [r.tokens for r in decode(tiny, mel, opts)]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "policy,gamma", [("fixed", 1), ("fixed", 3), ("fixed", 5), ("fixed", 8), ("adaptive", 5), ("analytic", 5)]
)
def test_greedy_speculative_equals_autoregressive(tiny, ar_reference, batch, policy, gamma):
    opts = DecodeOptions(
        draft_stop=0.0, mode="baseline", gamma=gamma, gamma_policy=policy, max_new_tokens=MAX_NEW
    )
    results = decode(tiny, _mels(3)[:batch], opts)
    assert [r.tokens for r in results] == ar_reference[:batch]
    stats = results[0].stats
    assert stats.proposed > 0
    assert stats.acceptance_rate < 0.9  # random drafts: the rejection path is exercised


def test_batch_rows_match_single_rows(tiny):
    opts = DecodeOptions(
        draft_stop=0.0, mode="baseline", gamma=4, gamma_policy="fixed", max_new_tokens=MAX_NEW
    )
    mel = _mels(3, seed=5)
    batched = [r.tokens for r in decode(tiny, mel, opts)]
    single = [decode(tiny, mel[i : i + 1], opts)[0].tokens for i in range(3)]
    assert batched == single


def test_gamma_never_overruns_the_token_limit(tiny):
    opts = DecodeOptions(draft_stop=0.0, mode="baseline", gamma=8, gamma_policy="fixed", max_new_tokens=11)
    ref = decode(tiny, _mels(1), replace(opts, mode="autoregressive"))[0]
    spec = decode(tiny, _mels(1), opts)[0]
    assert spec.tokens == ref.tokens
    assert len(spec.tokens) <= 11


@pytest.mark.parametrize("mode", ["autoregressive", "exact"])
def test_per_window_time_is_part_of_the_decoder_time_and_merges(tiny, mode, monkeypatch):
    """window_s counts runner set-up and the first target pass, once per window."""
    slow = 0.02
    make = loop.make_runner

    def slow_make(*args, **kwargs):  # a set-up that takes a known time
        time.sleep(slow)
        return make(*args, **kwargs)

    monkeypatch.setattr(loop, "make_runner", slow_make)
    opts = DecodeOptions(
        draft_stop=0.0, mode=mode, gamma=3, gamma_policy="fixed", max_new_tokens=MAX_NEW, timing=True
    )
    stats = decode(tiny, _mels(1), opts)[0].stats
    runners = 1 if mode == "autoregressive" else 2
    assert runners * slow < stats.window_s < stats.decoder_s  # set-up, plus a first pass
    assert stats.merge(stats).window_s == pytest.approx(2 * stats.window_s)


@pytest.fixture(params=["lean", "eager"])
def runner_kind(request, monkeypatch):
    """Both decoder forms: `LeanDecoder` (CPU fp32) and the model's own layers (elsewhere)."""
    if request.param == "eager":
        monkeypatch.setattr(LeanDecoder, "supports", staticmethod(lambda model: False))
    return request.param


def test_both_runners_decode_identically(tiny, ar_reference, runner_kind):
    opts = DecodeOptions(draft_stop=0.0, mode="exact", gamma=3, gamma_policy="fixed", max_new_tokens=MAX_NEW)
    runner = make_runner(tiny.target, torch.zeros(1, 1500, tiny.target.config.d_model))
    assert (runner.decoder is tiny.target.model.decoder) == (runner_kind == "eager")
    assert [r.tokens for r in decode(tiny, _mels(3), opts)] == ar_reference
    ar = decode(tiny, _mels(3), replace(opts, mode="autoregressive"))
    assert [r.tokens for r in ar] == ar_reference


class ParityStop:
    """A stop policy that depends on the draft's own sample: row 0's proposal odd -> stop."""

    def stop(self, rows, picked) -> bool:
        return bool(int(picked[0]) % 2)


@pytest.mark.parametrize("stop", [False, True])
def test_rollback_equals_cache_from_scratch(tiny, runner_kind, stop):
    """After every verify pass, both KV caches equal caches computed afresh on each row's
    prefix, also when the draft stop ends runs early (rows at different lengths:
    test_ragged.py)."""
    checked = {"rejections": 0, "passes": 0}

    def check(done: Pass) -> None:
        checked["passes"] += 1
        checked["rejections"] += sum(n < done.proposal.gamma for n in done.accepted)
        contexts = done.batch.contexts()
        for runner, model in ((done.target, tiny.target), (done.draft, tiny.draft)):
            assert runner.lengths == [len(c) - 1 for c in contexts] or runner is done.draft
            for j, c in enumerate(contexts):
                fresh = make_runner(model, runner.states[j : j + 1])
                fresh(torch.tensor([c[: runner.lengths[j]]]), 1)
                for a, b in zip(runner.cache_prefix(j), fresh.cache_prefix(0), strict=True):
                    assert a.shape == b.shape
                    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)

    hooks = Hooks(stop=ParityStop() if stop else None, on_pass=check)
    opts = DecodeOptions(mode="baseline", gamma=4, gamma_policy="fixed", max_new_tokens=30, draft_stop=0.0)
    stats = decode(tiny, _mels(2), opts, hooks=hooks)[0].stats
    assert checked["rejections"] >= 3 and checked["passes"] == len(stats.gammas)
    assert (0 < stats.draft_stops < len(stats.gammas)) if stop else stats.draft_stops == 0


# ---- the draft-confidence stop ---------------------------------------------------------------
def test_confidence_is_the_greatest_row_probability_of_the_picked_token():
    rows = torch.tensor([[0.0, 0.0, -math.inf], [2.0, 0.0, 0.0]])  # [B=2, V=3], filtered
    picked = torch.tensor([1, 0])
    e2 = math.exp(2)
    assert confidence(rows, picked, 0.0) == pytest.approx(max(0.5, e2 / (e2 + 2)))
    assert confidence(rows, picked, 1.0) == confidence(rows, picked, 0.0)  # T = 0 scores at T = 1
    assert confidence(rows[:1], picked[:1], 0.0) == pytest.approx(0.5)
    e4 = math.exp(4)  # at T = 0.5, row 1's pick has e^4 / (e^4 + 2)
    assert confidence(rows[1:], picked[1:], 0.5) == pytest.approx(e4 / (e4 + 2))


@pytest.mark.parametrize("batch", [1, 3])
def test_draft_stop_is_exact_at_t0_and_shortens_runs(tiny, ar_reference, batch):
    seen = []

    class Spy:  # never stops; records the draft's q(d) at every proposal
        def stop(self, rows, picked) -> bool:
            seen.append(confidence(rows, picked, 0.0))
            return False

    opts = DecodeOptions(mode="baseline", gamma=5, gamma_policy="fixed", max_new_tokens=MAX_NEW)
    full = decode(tiny, _mels(3)[:batch], opts, hooks=Hooks(stop=Spy()))[0].stats
    assert (
        full.draft_stops == 0 and full.gammas.count(5) > len(full.gammas) // 2
    )  # (the token limit clips the last)
    threshold = sorted(seen)[len(seen) // 4]  # the lower quartile of the q(d) observed
    results = decode(tiny, _mels(3)[:batch], replace(opts, draft_stop=threshold))
    assert [r.tokens for r in results] == ar_reference[:batch]
    st = results[0].stats
    assert st.draft_stops > 0 and min(st.gammas) < 5
    assert st.draft_calls == sum(st.gammas) < full.draft_calls
    assert st.proposed == batch * sum(st.gammas)


def test_draft_stop_must_be_a_probability_below_one():
    with pytest.raises(ValueError, match="draft_stop"):
        DecodeOptions(draft_stop=1.0)
    with pytest.raises(ValueError, match="draft_stop"):
        DecodeOptions(draft_stop=-0.1)


# ---- sampling: the output distribution is the target's --------------------------------------
N_SAMPLES = 20_000
N_TOKENS = 3


@torch.inference_mode()
def _exact_distribution(pair, states, opts) -> dict[tuple[int, ...], float]:
    """P(first N_TOKENS tokens) under target-only sampling, by enumeration (eot ends early)."""
    tok = pair.tokenizer
    init = tok.sot_sequence("en", "transcribe", False)
    filters = build_filters(
        tok,
        vocab_size=pair.vocab_size,
        sample_begin=len(init),
        suppress_tokens=(),
        begin_suppress_tokens=pair.begin_suppress_tokens,
        suppress_blank=True,
        timestamps=False,
    )
    dist = {(): 1.0}
    for _ in range(N_TOKENS):
        grow = [s for s in dist if not s or s[-1] != tok.eot]
        if not grow:
            break
        ctx = [init + list(s) for s in grow]
        # the reference implementation's logits, independent of specasr's decoder
        rows = states.expand(len(ctx), -1, -1)
        logits = hf_logits(pair.target, tok, rows, torch.tensor(ctx))[:, -1].contiguous()
        apply_filters(filters, logits, ctx)
        probs = torch.softmax(logits / opts.temperature, dim=-1)
        nxt = {}
        for s, row in zip(grow, probs.tolist()):
            for t, p in enumerate(row):
                if p > 0:
                    nxt[s + (t,)] = dist[s] * p
        dist = {**{s: p for s, p in dist.items() if s and s[-1] == tok.eot}, **nxt}
    return dist


def _tv(counts: dict, total: int, exact: dict) -> float:
    keys = set(counts) | set(exact)
    return 0.5 * sum(abs(counts.get(k, 0) / total - exact.get(k, 0.0)) for k in keys)


def _sample_outcomes(pair, mel, opts, hooks: Hooks | None = None) -> dict:
    counts: dict = {}
    per_batch = 5_000
    for i in range(N_SAMPLES // per_batch):
        batch = mel.expand(per_batch, -1, -1)
        for r in decode(pair, batch, replace(opts, seed=opts.seed + i), hooks=hooks):
            key = tuple(r.tokens[:N_TOKENS]) + ((pair.tokenizer.eot,) if len(r.tokens) < N_TOKENS else ())
            counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.fixture(scope="module")
def sampling_setup():
    pair = toy_pair(seed=3)
    mel = torch.randn(1, 80, TOY_FRAMES, generator=torch.Generator().manual_seed(11))
    opts = DecodeOptions(
        draft_stop=0.0,
        mode="baseline",
        temperature=1.0,
        gamma=2,
        gamma_policy="fixed",
        max_new_tokens=N_TOKENS,
        seed=123,
    )
    states, _ = pair.encode(mel)
    exact = _exact_distribution(pair, states, opts)
    # the TV distance an honest sampler shows at this sample size: simulated multinomial draws
    keys = list(exact)
    probs = torch.tensor([exact[k] for k in keys], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    null = []
    for _ in range(50):
        draws = torch.multinomial(probs, N_SAMPLES, replacement=True, generator=g).bincount(
            minlength=len(keys)
        )
        null.append(_tv({k: int(c) for k, c in zip(keys, draws)}, N_SAMPLES, exact))
    null_t = torch.tensor(null)
    bound = float(null_t.mean() + 6 * null_t.std())
    return pair, mel, opts, exact, bound


@pytest.mark.parametrize("sampling", ["coupled", "rejection"])  # decode/race.py, Leviathan's
def test_sampling_matches_target_distribution(sampling_setup, sampling):
    pair, mel, opts, exact, bound = sampling_setup
    counts = _sample_outcomes(pair, mel, replace(opts, sampling=sampling))
    tv = _tv(counts, N_SAMPLES, exact)
    print(f"TV(speculative, target) = {tv:.4f}; bound = {bound:.4f}; outcomes = {len(exact)}")
    assert tv <= bound


def test_sampling_check_rejects_an_always_accepting_verifier(sampling_setup, monkeypatch):
    pair, mel, opts, exact, bound = sampling_setup
    opts = replace(opts, sampling="rejection")  # the ratio test's verifier, replaced below

    def always_accept(target_logits, draft_logits, draft_tokens, uniforms, noise, **kw):
        gamma = draft_tokens.shape[1]
        p = torch.softmax(target_logits[:, gamma].float() / kw["temperature"], dim=-1)
        n = torch.full((draft_tokens.shape[0],), gamma, dtype=torch.long)
        return n, (p / noise).argmax(dim=-1)

    monkeypatch.setattr(kernels, "verify", always_accept)
    counts = _sample_outcomes(pair, mel, opts)
    tv = _tv(counts, N_SAMPLES, exact)
    print(f"TV(always-accept, target) = {tv:.4f}; bound = {bound:.4f}")
    assert tv > bound


@pytest.mark.parametrize("sampling", ["coupled", "rejection"])  # decode/race.py, Leviathan's
def test_sampling_with_a_draft_dependent_stop_matches_target_distribution(sampling_setup, sampling):
    """Ending a draft run on the draft's own sample keeps the target's distribution."""
    pair, mel, opts, exact, bound = sampling_setup
    counts = _sample_outcomes(pair, mel, replace(opts, gamma=3, sampling=sampling), Hooks(stop=ParityStop()))
    tv = _tv(counts, N_SAMPLES, exact)
    print(f"TV(speculative with stops, target) = {tv:.4f}; bound = {bound:.4f}")
    assert tv <= bound


@pytest.mark.parametrize("sampling", ["coupled", "rejection"])  # decode/race.py, Leviathan's
def test_autoregressive_sampling_matches_target_distribution(sampling_setup, sampling):
    pair, mel, opts, exact, bound = sampling_setup
    counts = _sample_outcomes(pair, mel, replace(opts, mode="autoregressive", sampling=sampling))
    assert _tv(counts, N_SAMPLES, exact) <= bound


def test_sampling_is_seeded(tiny):
    opts = DecodeOptions(draft_stop=0.0, mode="baseline", temperature=1.0, gamma=3, max_new_tokens=20, seed=7)
    a, b = (decode(tiny, _mels(2), opts) for _ in range(2))
    assert [r.tokens for r in a] == [r.tokens for r in b]
    c = decode(tiny, _mels(2), replace(opts, seed=8))
    assert [r.tokens for r in a] != [r.tokens for r in c]


@pytest.mark.parametrize("mode", ["autoregressive", "exact"])
def test_no_speech_prob_is_read_at_the_sot_row_after_a_prompt(tiny, mode):
    """The first pass computes logits from <|startoftranscript|> on, not over the prompt; the
    no-speech probability is still the one at that row."""
    prompt = [440, 2068, 3699, 264, 13, 1012]
    mel = _mels(1, seed=9)
    opts = DecodeOptions(mode=mode, gamma=3, gamma_policy="fixed", max_new_tokens=8)
    result = decode(tiny, mel, opts, prompt=prompt)[0]
    init, sot = start_sequence(tiny, opts, "en", prompt)
    states = tiny.encode(mel)[0]
    with torch.inference_mode():
        logits = hf_logits(tiny.target, tiny.tokenizer, states, torch.tensor([init]))  # [1, L, V]
    expected = torch.softmax(logits[0, sot].float(), -1)[tiny.tokenizer.no_speech].item()
    assert sot > 0 and result.no_speech_prob == pytest.approx(expected, rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("sampling", ["coupled", "rejection"])  # decode/race.py, Leviathan's
def test_sampling_with_a_reduced_vocabulary_draft_matches_target_distribution(sampling_setup, sampling):
    """A distilled draft proposes from its own columns (`Proposal.columns`): filters, the
    race and the stop read reduced rows, and the verifier gets them back over the whole
    vocabulary. Half the tokens are off its vocabulary, so the residual must carry them."""
    pair, mel, opts, exact, bound = sampling_setup
    t = pair.target
    ids = torch.tensor(sorted({pair.tokenizer.eot, *range(0, pair.vocab_size, 2)}))
    reduced = replace(pair, draft=DistilledDraft.from_target(t, (0,), ids).attach(t), shared_encoder=True)
    counts = _sample_outcomes(
        reduced, mel, replace(opts, mode="exact", sampling=sampling), Hooks(stop=ParityStop())
    )
    tv = _tv(counts, N_SAMPLES, exact)
    print(f"TV(reduced draft, target) = {tv:.4f}; bound = {bound:.4f}")
    assert tv <= bound
