"""Speculative-decoding statistics: what was proposed, accepted, and where the time went.

Imports no torch (the clocks import it when they time a CUDA device), so front ends that only
read statistics, such as `specasr transcribe --server`, start without it."""

from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class DecodeStats:
    target_calls: int = 0  # target decoder forward passes (verify passes in speculative mode)
    draft_calls: int = 0  # draft decoder forward passes
    proposed: int = 0  # draft tokens offered to the verifier, summed over rows
    accepted: int = 0  # draft tokens the verifier accepted, summed over rows
    rejected: int = 0  # (row, pass) pairs that rejected a draft token (n < γ)
    emitted: int = 0  # tokens appended to the output, summed over rows (accepted + corrections/bonus)
    row_steps: int = 0  # (row, verify pass) pairs: the denominator of tokens per target call
    accepted_hist: Counter = field(default_factory=Counter)  # n accepted -> how many (row, pass) pairs
    draft_stops: int = 0  # draft runs the confidence stop ended before γ (DecodeOptions.draft_stop)
    gammas: list[int] = field(default_factory=list)  # γ used at each verify pass
    encoder_s: float = 0.0  # wall seconds in the encoder(s)
    decoder_s: float = 0.0  # wall seconds of the whole decoding loop
    # phase times, recorded only with DecodeOptions(timing=True) (`Clock`); 0 otherwise
    draft_s: float = 0.0  # seconds in draft forward passes (incl. sampling the proposal)
    target_s: float = 0.0  # seconds in target forward passes (incl. logit filters)
    verify_s: float = 0.0  # seconds in the verifier
    window_s: float = 0.0  # of decoder_s, paid once per window: runner set-up, first target pass
    verify_times: list[float] = field(default_factory=list)  # verifier seconds of each verify pass

    @property
    def acceptance_rate(self) -> float:
        """accepted / proposed draft tokens. Proposals after a rejection count as not
        accepted, so with γ > 1 this is below the per-token acceptance probability."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def token_acceptance(self) -> float:
        """α̂ per token: accepted / (accepted + rejected), the maximum-likelihood estimate of
        the probability that a draft token the verifier reaches is accepted (the α of
        (1 − α^(γ+1)) / (1 − α)). At T = 0 it is the draft's greedy agreement with the target."""
        seen = self.accepted + self.rejected
        return self.accepted / seen if seen else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        """Mean tokens emitted per row per target pass (1.0 for autoregressive decoding)."""
        return self.emitted / self.row_steps if self.row_steps else 0.0

    def record_pass(self, gamma: int, accepted: list[int], emitted: list[int], stopped: bool) -> None:
        """One speculative verify pass over len(accepted) rows: γ proposals per row, the
        count the verifier accepted per row, the tokens each row emitted, and whether the
        draft stop ended the run before the γ asked for."""
        rows = len(accepted)
        self.target_calls += 1
        self.draft_calls += gamma
        self.proposed += gamma * rows
        self.accepted += sum(accepted)
        self.rejected += sum(n < gamma for n in accepted)
        self.accepted_hist.update(accepted)
        self.emitted += sum(emitted)
        self.row_steps += rows
        self.draft_stops += stopped
        self.gammas.append(gamma)

    def record_step(self, rows: int) -> None:
        """One target-only step: one token for each of `rows` rows."""
        self.target_calls += 1
        self.emitted += rows
        self.row_steps += rows

    def merge(self, other: DecodeStats) -> DecodeStats:
        """Sum of two stats (used to aggregate windows, files and batches)."""
        out = DecodeStats()
        for f in fields(self):  # counts and seconds add; the histogram and lists below
            mine = getattr(self, f.name)
            if isinstance(mine, (int, float)):
                setattr(out, f.name, mine + getattr(other, f.name))
        out.accepted_hist = self.accepted_hist + other.accepted_hist
        out.gammas = self.gammas + other.gammas
        out.verify_times = self.verify_times + other.verify_times
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["accepted_hist"] = {str(k): v for k, v in sorted(self.accepted_hist.items())}
        d["acceptance_rate"] = self.acceptance_rate
        d["token_acceptance"] = self.token_acceptance
        d["tokens_per_target_call"] = self.tokens_per_target_call
        return d

    @classmethod
    def from_dict(cls, d: dict) -> DecodeStats:
        """The inverse of `to_dict` (its derived rates are recomputed, not read); keys it does
        not know are ignored, so a newer writer's document still reads."""
        known = {f.name for f in fields(cls)}
        stats = cls(**{k: v for k, v in d.items() if k in known and k != "accepted_hist"})
        stats.accepted_hist = Counter({int(k): v for k, v in d.get("accepted_hist", {}).items()})
        return stats

    def summary(self) -> str:
        hist = " ".join(f"{k}:{v}" for k, v in sorted(self.accepted_hist.items()))
        return (
            f"target calls {self.target_calls}, draft calls {self.draft_calls}, "
            f"accepted {self.accepted}/{self.proposed} ({self.acceptance_rate:.3f}; per token "
            f"α̂={self.token_acceptance:.3f}), "
            f"tokens/target call {self.tokens_per_target_call:.2f}, accepted-count histogram [{hist}]\n"
            f"time: encoder {self.encoder_s * 1e3:.1f} ms, draft {self.draft_s * 1e3:.1f} ms, "
            f"target {self.target_s * 1e3:.1f} ms, verify {self.verify_s * 1e3:.1f} ms, "
            f"decoder loop {self.decoder_s * 1e3:.1f} ms"
        )


class Clock:
    """Adds the time of named phases to a `DecodeStats`, only when timing is on.

    Off: it reads no clock and never synchronises, so it costs the loop nothing. On, on a
    CPU: wall time. On, on CUDA: a pair of CUDA events around each phase, which records
    without synchronising; `flush` reads them all after one synchronisation. A phase
    called "verify_s" also appends its time to `verify_times`."""

    def __init__(self, stats: DecodeStats, device: torch.device, enabled: bool) -> None:
        self.stats, self.enabled = stats, enabled
        self.events = enabled and device.type == "cuda"
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def phase(self, name: str | None):
        if not self.enabled or name is None:
            yield
            return
        if self.events:
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._pending.append((name, start, end))
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._add(name, time.perf_counter() - t0)

    def _add(self, name: str, seconds: float) -> None:
        setattr(self.stats, name, getattr(self.stats, name) + seconds)
        if name == "verify_s":
            self.stats.verify_times.append(seconds)

    def flush(self) -> None:
        """Reads the CUDA events recorded so far into the stats (one synchronisation)."""
        if not self._pending:
            return
        self._pending[-1][2].synchronize()
        for name, start, end in self._pending:
            self._add(name, start.elapsed_time(end) / 1e3)
        self._pending.clear()


@contextmanager
def timed(stats: DecodeStats, name: str | None, device: torch.device):
    """Adds the wall time of the block to `stats.<name>` (name None: times nothing); on CUDA,
    synchronises first so the time is the device's, not the launch's. For the totals around
    a whole stage (encoder_s, decoder_s), never inside a decoding step: steps use `Clock`."""
    if name is None:
        yield
        return
    sync = device.type == "cuda"
    if sync:
        import torch

        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if sync:
            torch.cuda.synchronize(device)
        setattr(stats, name, getattr(stats, name) + time.perf_counter() - t0)
