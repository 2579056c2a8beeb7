"""Speculative-decoding statistics: what was proposed, accepted, and where the time went."""

from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields

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
    draft_s: float = 0.0  # wall seconds in draft forward passes (incl. sampling the proposal)
    target_s: float = 0.0  # wall seconds in target forward passes (incl. logit filters)
    verify_s: float = 0.0  # wall seconds in the verifier
    decoder_s: float = 0.0  # wall seconds of the whole decoding loop
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


@contextmanager
def timed(stats: DecodeStats, name: str | None, device: torch.device):
    """Adds the wall time of the block to `stats.<name>` (name None: times nothing); on CUDA,
    synchronises first so the time is the device's, not the launch's."""
    if name is None:
        yield
        return
    sync = device.type == "cuda"
    if sync:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if sync:
            torch.cuda.synchronize(device)
        setattr(stats, name, getattr(stats, name) + time.perf_counter() - t0)
