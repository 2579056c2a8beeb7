"""Sampling with noise keyed by position: the same sample in every mode (`DecodeOptions.sampling`).

A token sampled at temperature T is the winner of the exponential race,
argmax_k (l_k / T + G_k) with G_k = -log E_k, E_k ~ Exp(1) i.i.d.: an exact sample from
softmax(l / T). Under the `coupled` rule the E of a row's position come from a stream keyed by
(seed, row, position), not from one generator read in order, so every reader of a position sees
the same race:
- autoregressive decoding samples each token as the target's race winner there;
- the draft proposes its own race winner at each position, with the same E;
- the verifier accepts a draft token exactly when it is the target's race winner at its position,
  and at the first that is not, emits the target's winner (the bonus token likewise).
So every emitted token is the target's race winner at its position: an exact sample from the
target (each position's E are independent of everything decoded before it), and the same tokens
as autoregressive decoding with that seed, whatever the draft, γ or mode. A draft token is
accepted with P(both races have one winner), against 1 - TV(p, q) for the `rejection` rule
(Leviathan et al.; the paper's kernels), which matches only the distribution
(docs/benchmarks.md measures both).

The seed already differs per window (`TranscribeOptions`: seed + window); `row` is the row's
index in its decode's batch, which autoregressive and speculative decoding number alike.
"""

from __future__ import annotations

import torch
from torch import Tensor

_MASK = (1 << 64) - 1


def race_key(seed: int, row: int, position: int) -> int:
    """A 63-bit generator seed for (seed, row, position): splitmix64's finaliser over their
    odd-multiplier mix, so neighbouring keys get unrelated streams."""
    x = (seed * 0x9E3779B97F4A7C15 + row * 0xBF58476D1CE4E5B9 + position * 0x94D049BB133111EB + 1) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return (x ^ (x >> 31)) >> 1


class KeyedRace:
    """Gumbel noise G = -log E [V] per (row, position) of one decode, each drawn once: the
    draft's proposals and the verifier's pass over the same positions read the same tensor."""

    def __init__(self, seed: int, vocab_size: int, device: torch.device) -> None:
        self.seed, self.vocab_size, self.device = seed, vocab_size, device
        self._held: dict[tuple[int, int], Tensor] = {}  # (row, position) -> G [V], float32

    def gumbel(self, rows: list[int], positions: list[int]) -> Tensor:
        """rows, positions: one (row, position) per output row -> G [len(rows), V] float32."""
        out = []
        for row, position in zip(rows, positions):
            g = self._held.get((row, position))
            if g is None:
                gen = torch.Generator(device=self.device).manual_seed(race_key(self.seed, row, position))
                # E = -log U, U ~ U[0, 1) (U = 0: E = inf, a token that never wins); G = -log E.
                # Two logs over V cost a third of torch's exponential_ on a CPU
                u = torch.empty(self.vocab_size, device=self.device).uniform_(generator=gen)
                g = self._held[(row, position)] = u.log_().neg_().log_().neg_()
            out.append(g)
        return torch.stack(out)

    def forget(self, row: int, below: int) -> None:
        """Drops row `row`'s noise for positions before `below`: they are decoded for good."""
        for key in [k for k in self._held if k[0] == row and k[1] < below]:
            del self._held[key]


def race_pick(logits: Tensor, temperature: float, gumbel: Tensor) -> Tensor:
    """logits [N, C], gumbel [N, C] (the keyed noise of each row's position, on the same
    columns) -> each row's race winner [N] (columns of `logits`)."""
    return (logits.float() / temperature + gumbel).argmax(dim=-1)
