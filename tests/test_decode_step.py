"""The loop's opt-in timing (`stats.Clock`) and the phases' bookkeeping."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny_pairs import random_tiny_pair

from specasr.decode.loop import decode
from specasr.decode.step import Hooks
from specasr.options import DecodeOptions
from specasr.stats import Clock, DecodeStats

PHASES = ("draft_s", "target_s", "verify_s", "window_s")


@pytest.fixture(scope="module")
def tiny():
    return random_tiny_pair(seed=0, draft_layers=1)


def _mels(batch: int) -> torch.Tensor:
    return torch.randn(batch, 80, 3000, generator=torch.Generator().manual_seed(4))  # [B, 80, 3000]


@pytest.mark.parametrize("mode", ["autoregressive", "exact"])
def test_phase_times_are_recorded_only_when_asked(tiny, mode):
    opts = DecodeOptions(mode=mode, gamma=3, gamma_policy="fixed", draft_stop=0.0, max_new_tokens=20)
    off = decode(tiny, _mels(2), opts)
    on = decode(tiny, _mels(2), replace(opts, timing=True))
    assert [r.tokens for r in off] == [r.tokens for r in on]
    s_off, s_on = off[0].stats, on[0].stats
    assert all(getattr(s_off, p) == 0.0 for p in PHASES) and s_off.verify_times == []
    assert s_off.decoder_s > 0 and s_off.encoder_s > 0  # the stage totals are always there
    assert s_on.target_s > 0 and s_on.window_s > 0
    if mode == "exact":
        assert s_on.draft_s > 0 and len(s_on.verify_times) == len(s_on.gammas)  # one per verify pass


def test_the_analytic_policy_times_its_phases_even_without_timing(tiny):
    opts = DecodeOptions(mode="exact", gamma=3, gamma_policy="analytic", draft_stop=0.0, max_new_tokens=20)
    assert decode(tiny, _mels(1), opts)[0].stats.draft_s > 0


class _FakeEvent:
    """Stands in for torch.cuda.Event: counts synchronisations, reports 2 ms per pair."""

    syncs = 0
    clock = 0.0

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = None

    def record(self) -> None:
        _FakeEvent.clock += 1.0
        self.t = _FakeEvent.clock

    def synchronize(self) -> None:
        _FakeEvent.syncs += 1

    def elapsed_time(self, end) -> float:
        return 2.0 * (end.t - self.t)  # ms


def test_cuda_clock_records_events_and_reads_them_once(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(_FakeEvent, "syncs", 0)
    stats = DecodeStats()
    clock = Clock(stats, torch.device("cuda"), enabled=True)
    for _ in range(3):
        with clock.phase("draft_s"):
            pass
        with clock.phase("verify_s"):
            pass
    assert _FakeEvent.syncs == 0 and stats.draft_s == 0.0  # nothing read inside the loop
    clock.flush()
    assert _FakeEvent.syncs == 1
    assert stats.draft_s == pytest.approx(3 * 2e-3) and stats.verify_times == pytest.approx([2e-3] * 3)


def test_a_disabled_clock_never_touches_the_device(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a disabled clock made a CUDA event")

    monkeypatch.setattr(torch.cuda, "Event", boom)
    stats = DecodeStats()
    clock = Clock(stats, torch.device("cuda"), enabled=False)
    with clock.phase("target_s"):
        pass
    clock.flush()
    assert stats.target_s == 0.0


def test_record_pass_counts_one_speculative_pass():
    stats = DecodeStats()
    stats.record_pass(gamma=4, accepted=[4, 1, 2], emitted=[3, 2, 3], stopped=True)
    assert (stats.target_calls, stats.draft_calls, stats.proposed, stats.accepted) == (1, 4, 12, 7)
    assert (stats.rejected, stats.emitted, stats.row_steps, stats.draft_stops) == (2, 8, 3, 1)
    assert stats.accepted_hist == {4: 1, 1: 1, 2: 1} and stats.gammas == [4]


def test_on_pass_sees_every_speculative_pass(tiny):
    seen = []
    opts = DecodeOptions(mode="exact", gamma=3, gamma_policy="fixed", draft_stop=0.0, max_new_tokens=20)
    result = decode(tiny, _mels(1), opts, hooks=Hooks(on_pass=seen.append))[0]
    assert len(seen) == len(result.stats.gammas) > 0  # every verify pass, none of the target-only steps
    assert sum(p.advanced[0] for p in seen) <= len(result.tokens) + 1  # (+1: the eot)
    assert all(p.advanced[0] <= p.accepted[0] + 1 for p in seen)  # fewer only where cut at the limit
    assert all(1 <= p.advanced[0] <= p.proposal.gamma + 1 for p in seen)


def test_token_kinds_follow_the_verifier(tiny):
    """Each pass emits accepted drafts, then one corrected or bonus token; target-only
    decoding emits target tokens."""
    passes = []
    opts = DecodeOptions(mode="exact", gamma=3, gamma_policy="fixed", draft_stop=0.0, max_new_tokens=20)
    spec = decode(tiny, _mels(1), opts, hooks=Hooks(on_pass=passes.append))[0]
    ar = decode(tiny, _mels(1), replace(opts, mode="autoregressive"))[0]
    assert spec.tokens == ar.tokens and set(ar.token_kinds) == {"target"}
    assert len(spec.token_kinds) == len(spec.tokens)
    expected = []
    for p in passes:  # one row: it advances by accepted + 1
        n = p.accepted[0]
        expected += ["draft"] * n + ["bonus" if n == p.proposal.gamma else "corrected"]
    assert len(expected) >= len(spec.tokens)  # the token limit cuts a pass, never needs a target step
    assert spec.token_kinds == expected[: len(spec.tokens)]
    assert "corrected" in spec.token_kinds  # random drafts: rejections happen


def test_the_gamma_policy_hears_the_batch_size_and_every_rows_count(tiny, monkeypatch):
    """The loop asks the γ policy for each pass with the rows still decoding, and reports every
    row's accepted count (the backoff policy judges a batch by its size and pools the rows)."""
    from specasr.decode import loop
    from specasr.decode.gamma import FixedGamma

    asked, told = [], []

    class Recording(FixedGamma):
        def next(self, rows: int = 1) -> int:
            asked.append(rows)
            return self.gamma

        def update(self, gamma, accepted, draft_s=0.0, target_s=0.0, stopped=False, per_row=None):
            told.append((accepted, per_row))

    monkeypatch.setattr(loop, "make_policy", lambda *a, **k: Recording(3))
    opts = DecodeOptions(mode="exact", gamma=3, draft_stop=0.0, max_new_tokens=12)
    results = decode(tiny, _mels(3), opts)
    assert asked[0] == 3 and asked == sorted(asked, reverse=True)  # rows drop out as they end
    assert len(told) == len(results[0].stats.gammas) > 0
    for (least, rows), n in zip(told, asked):
        assert len(rows) == n and least == min(rows) and all(0 <= a <= 3 for a in rows)


@pytest.mark.parametrize("mode", ["baseline", "exact", "sigmoid"])
def test_greedy_verify_never_builds_the_drafts_full_rows(tiny, monkeypatch, mode):
    """At T = 0 every mode is argmax matching: the verifier gets broadcast views for q, r and
    the noise instead of γ·V floats per pass, and still keeps the target's greedy tokens.
    Sampling by the rejection rule still builds the draft's rows over V (its q); the coupled
    rule's verify is argmax matching on raced rows, which needs no q."""
    from specasr.decode.step import Proposal

    built = []
    full = Proposal.full_logits
    monkeypatch.setattr(Proposal, "full_logits", lambda self, V: built.append(V) or full(self, V))
    opts = DecodeOptions(mode=mode, gamma=3, gamma_policy="fixed", draft_stop=0.0, max_new_tokens=20)
    spec = decode(tiny, _mels(2), opts)
    ar = decode(tiny, _mels(2), replace(opts, mode="autoregressive"))
    assert [r.tokens for r in spec] == [r.tokens for r in ar] and not built
    decode(tiny, _mels(1), replace(opts, temperature=1.0, seed=3))
    assert bool(built) == (mode == "sigmoid")  # (sigmoid keeps its own rule)
    built.clear()
    decode(tiny, _mels(1), replace(opts, temperature=1.0, seed=3, sampling="rejection"))
    assert built and set(built) == {tiny.target.config.vocab_size}
