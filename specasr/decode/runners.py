"""Decoder runners: one model's decoder and its KV cache, behind one interface.

Every runner is a `LeanRunner` (`specasr.runtime.runner`): a preallocated, position-indexed cache
over plain torch layers. A Whisper target in fp32 on a CPU runs through its `LeanDecoder`
view (the same layers with faster product forms); elsewhere (CUDA, fp16) the model's own
decoder layers run as they are; distilled drafts bring their own runner (`BringsRunner`).

Every row of a runner has its own length (ragged rows: a row keeps every token it
accepted, whatever the other rows accepted). Invariant between passes: the target runner
holds every context token but the newest, the draft runner at most that, so the next pass
feeds row b's `context[lengths[b]:]` plus any new proposals (`step.feed`). Rolling back
sets lengths; nothing is recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from specasr.runtime.runner import LeanDecoder, LeanRunner, lean_decoder


class Runner(Protocol):
    """What the decoding loop needs of a decoder and its cache. A runner over a reduced
    vocabulary (`LeanRunner` of a distilled draft) also offers `vocab` (the token of each
    column, ascending), `columns` (the same as a tensor) and `__call__(..., reduced=True)`,
    which returns logits over those N columns; the speculative loop uses them when present."""

    lengths: list[int]  # per row: positions the cache holds
    states: Tensor  # [B, S, d] encoder states of the rows still decoding

    def __call__(self, tokens: Tensor, last: int) -> Tensor:
        """tokens [B, k], row b's at positions lengths[b] … lengths[b]+k-1 -> logits
        [B, last, V] of the final rows."""
        ...

    def rollback(self, lengths: int | list[int]) -> None:
        """Forget every position from `lengths` on: one length for all rows, or one per row."""
        ...

    def keep(self, rows: list[int]) -> None:
        """Keep only these batch rows (finished rows stop consuming work); rows may repeat and
        come in any order (a beam search's first step)."""
        ...

    def reorder(self, rows: list[int]) -> None:
        """Row i takes row rows[i]'s cache, for rows on the same encoder states (a beam step)."""
        ...

    def cache_prefix(self, row: int) -> list[Tensor]:
        """Per layer one row's valid self-attention K and V [H, lengths[row], dh]."""
        ...


@runtime_checkable
class BringsRunner(Protocol):
    """A model with its own runner (a distilled draft): `target_cross` is the target
    runner's per-layer cross-attention K/V on the same encoder states, or None."""

    def runner(self, states: Tensor, target_cross: list | None = None) -> Runner: ...


def make_runner(
    model, encoder_states: Tensor, target: Runner | None = None, *, private: bool = False
) -> Runner:
    """The runner for a model: a distilled draft brings its own; a Whisper model in fp32 on
    CPU runs through its `LeanDecoder` view (same function, faster products); anything else
    runs its own decoder layers. target: the target's runner, whose cross K/V a distilled
    draft on the same states may reuse. private: the runner's cross K/V are its own to write
    (the device loop refills its kept runners' in place), neither read from nor held for the
    other runners on these states."""
    if isinstance(model, BringsRunner):
        shared = isinstance(target, LeanRunner) and target.states is encoder_states
        return model.runner(encoder_states, target.plain_cross() if shared else None)
    decoder = _decoder(model)
    if private:
        return LeanRunner(decoder, encoder_states)
    held = _held(encoder_states, decoder)
    if held is not None:
        if held.mine:  # handed over once (`join_cross`)
            del _CROSS[encoder_states][id(decoder)]
        return LeanRunner(decoder, encoder_states, held.cross, mine=held.mine)
    runner = LeanRunner(decoder, encoder_states)
    if encoder_states.shape[0] == 1:  # one row: `keep` never moves it, so the runner may share it
        _hold(encoder_states, _Held(decoder, list(runner.plain_cross()), mine=False))
    return runner


def _decoder(model):
    """A Whisper model's decoder as its runner runs it: the `LeanDecoder` view in fp32 on a
    CPU, else its own layers."""
    return lean_decoder(model) if LeanDecoder.supports(model) else model.model.decoder


@dataclass(frozen=True)
class _Held:
    """One decoder's cross K/V per layer [B, H, S, dh] on one encoder states tensor."""

    decoder: object
    cross: list[tuple[Tensor, Tensor]]
    mine: bool  # handed to the next runner to own (True), or shared by every runner (False)


# Encoder states -> per decoder (by id) its cross K/V on them, computed by the first runner
# over one window's states and read by every later one while the states live: the window's
# language detection, its decode and each temperature fallback project the frames once.
_CROSS = WeakIdKeyDictionary()


def _held(states: Tensor, decoder) -> _Held | None:
    held = _CROSS.get(states, {}).get(id(decoder))
    return held if held is not None and held.decoder is decoder else None


def _hold(states: Tensor, held: _Held) -> None:
    _CROSS.setdefault(states, {})[id(held.decoder)] = held


def join_cross(model, parts: list[Tensor], joined: Tensor) -> bool:
    """When every one of `parts` (encoder states [1, S, d] each) holds the model's cross K/V,
    hands their concatenation to the next runner built on `joined` (the parts' rows, in
    order): a batch of windows whose detection already projected their frames does not
    project them again. Returns whether it did."""
    if isinstance(model, BringsRunner):
        return False
    decoder = _decoder(model)
    held = [_held(p, decoder) for p in parts]
    if not held or any(h is None for h in held):
        return False
    with torch.inference_mode():
        cross = [
            (torch.cat([h.cross[i][0] for h in held]), torch.cat([h.cross[i][1] for h in held]))
            for i in range(len(held[0].cross))
        ]
    _hold(joined, _Held(decoder, cross, mine=True))
    return True


class PromptTail:
    """A draft runner that reads only the last `keep` tokens of a <|startofprev|> prompt.

    Long-form decoding prompts each window with up to 223 tokens of the text before it; the
    distilled draft was trained with prompts of 8–120 unrelated tokens and agrees with the
    target less after long ones (docs/distill.md). The draft's own sequence is the context
    without prompt tokens 1 … `drop` (position 0, <|startofprev|>, stays), so its positions
    run `drop` behind the target's. `lengths` and `rollback` speak the context's positions, as
    the loop's `feed` expects; every row of a batch shares the prompt, so `drop` is one number.
    The target reads the whole prompt: only α moves, never the output.
    """

    def __init__(self, inner: Runner, drop: int) -> None:
        self.inner, self.drop = inner, drop

    @property
    def lengths(self) -> list[int]:
        """Per row: the context positions held (an empty row holds none)."""
        return [n + self.drop if n else 0 for n in self.inner.lengths]

    @property
    def states(self) -> Tensor:
        return self.inner.states

    @property
    def vocab(self) -> list[int] | None:
        return getattr(self.inner, "vocab", None)

    @property
    def columns(self) -> Tensor:
        return self.inner.columns

    def __call__(self, tokens: Tensor, last: int, **kwargs) -> Tensor:
        """tokens [B, k] of the context; a first pass (every row empty: `feed` gives the whole
        context) loses prompt tokens 1 … drop -> the inner runner's logits [B, last, ·]."""
        if not any(self.inner.lengths):
            tokens = torch.cat([tokens[:, :1], tokens[:, 1 + self.drop :]], dim=1)
        return self.inner(tokens, last, **kwargs)

    def rollback(self, lengths: int | list[int]) -> None:
        if isinstance(lengths, int):
            lengths = [lengths] * len(self.inner.lengths)
        # after a first pass every row holds the start sequence, beyond the dropped prompt
        self.inner.rollback([max(n - self.drop, 1) if n else 0 for n in lengths])

    def keep(self, rows: list[int]) -> None:
        self.inner.keep(rows)

    def reorder(self, rows: list[int]) -> None:
        self.inner.reorder(rows)

    def cache_prefix(self, row: int) -> list[Tensor]:
        return self.inner.cache_prefix(row)


def prompt_drop(prompt_len: int, keep: int | None) -> int:
    """Prompt tokens a draft skips (1 … drop after <|startofprev|>) when it may read only the
    last `keep` of `prompt_len` (None: all): the host loop's `PromptTail` and the device loop's
    (`decode.graphed`) alike."""
    return 0 if keep is None else max(prompt_len - keep, 0)


def prompt_tail(runner: Runner, prompt_len: int, keep: int | None) -> Runner:
    """The draft's runner for a decode whose start sequence holds a prompt of `prompt_len`
    tokens after <|startofprev|> (0: none): a `PromptTail` when it may read only `keep`."""
    drop = prompt_drop(prompt_len, keep)
    return PromptTail(runner, drop) if drop else runner
