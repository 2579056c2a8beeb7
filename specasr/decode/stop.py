"""Draft-stop policies: when a draft run ends before γ proposals.

Like the γ policies (`gamma.py`), a stop policy only shapes the proposal. Exactness is
untouched as long as the decision depends on the draft's own proposals, never on the
target: every offered proposal is still verified against the target's distribution, and
every position the draft did not reach is drawn from the target itself.

`ConfidenceStop` ends a run at a proposal the draft is unsure of, q(d) < threshold: the
tokens after it would probably be rejected, so their draft steps and verify positions
would be wasted, and on a CPU a longer verify pass costs more. That proposal is still
offered. In a batch the run ends only once every row is unsure (the greatest q over the
rows is below the threshold): rows are ragged, so each keeps what it accepted, and a row
that is still sure would lose its tokens to a stop decided by its least sure neighbour.
On the long-form fixture with base and the packaged draft, stopping at the least sure row
cut the tokens per pass at B = 8 well below B = 1's (measured: docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


class DraftStop(Protocol):
    def stop(self, rows: Tensor, picked: Tensor) -> bool:
        """rows [B, V] (or [B, N] over a reduced draft's vocabulary): the draft's filtered
        logits; picked [B]: the columns of rows drawn. True ends the run after these proposals."""
        ...


class NeverStop:
    def stop(self, rows: Tensor, picked: Tensor) -> bool:
        return False


def confidence(rows: Tensor, picked: Tensor, temperature: float) -> float:
    """The greatest, over the batch's rows, of the draft's probability of the token it
    picked: q(d) = softmax(rows / T)[d], with T = 1 for greedy drafts. rows [B, V], picked [B]."""
    scaled = rows.float() / temperature if temperature > 0 else rows.float()
    # softmax, not logsumexp: a draft row is −inf off its vocabulary, where torch.logsumexp
    # is several times slower than softmax on a CPU
    return float(torch.softmax(scaled, -1).gather(1, picked[:, None]).max())


@dataclass(frozen=True)
class ConfidenceStop:
    threshold: float  # stop once q(proposal) < this in every row
    temperature: float  # the decode's temperature (0: greedy drafts, scored at T = 1)

    def stop(self, rows: Tensor, picked: Tensor) -> bool:
        return confidence(rows, picked, self.temperature) < self.threshold


def make_stop(threshold: float, temperature: float) -> DraftStop:
    """`DecodeOptions.draft_stop` as a policy: 0 never stops."""
    return ConfidenceStop(threshold, temperature) if threshold > 0 else NeverStop()
