"""Decoder runners: one model's decoder and its KV cache, behind one interface.

- `LeanRunner` (`specasr.cpu.lean`): a preallocated, position-indexed cache over plain
  torch layers. Used for a Whisper target in fp32 on CPU (through its `LeanDecoder` view)
  and for distilled drafts, which bring their own (`BringsRunner`).
- `DecoderRunner`: the Hugging Face modules and their `EncoderDecoderCache` (CUDA, fp16,
  `self:K` drafts off CPU).

Invariant between passes: a runner holds every context token but the newest, so the next
pass feeds `context[runner.length:]` plus any new proposals. Rolling back sets a length;
nothing is recomputed.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from specasr.cpu.lean import LeanDecoder, LeanRunner, lean_decoder


class Runner(Protocol):
    """What the decoding loop needs of a decoder and its cache."""

    length: int  # positions the cache holds, equal for every row
    states: Tensor  # [B, S, d] encoder states of the rows still decoding

    def __call__(self, tokens: Tensor, last: int) -> Tensor:
        """tokens [B, k] at positions length … length+k-1 -> logits [B, last, V] of the final rows."""
        ...

    def rollback(self, length: int) -> None:
        """Forget every position from `length` on."""
        ...

    def keep(self, rows: Tensor) -> None:
        """Keep only these batch rows (finished rows stop consuming work)."""
        ...

    def cache_prefix(self) -> list[Tensor]:
        """Per layer the valid self-attention K and V [B, H, length, dh]."""
        ...


@runtime_checkable
class BringsRunner(Protocol):
    """A model with its own runner (a distilled draft): `target_cross` is the target
    runner's per-layer cross-attention K/V on the same encoder states, or None."""

    def runner(self, states: Tensor, target_cross: list | None = None) -> Runner: ...


class DecoderRunner:
    """One Whisper decoder (Hugging Face modules) and its KV cache, for CUDA and non-fp32
    models; on CPU in fp32 `make_runner` picks `LeanRunner`. The cache holds the first
    `length` positions of every row; rows are kept at equal length."""

    def __init__(self, model, encoder_states: Tensor) -> None:
        self.model = model
        self.states = encoder_states  # [B, 1500, d_model]
        self.cache = None
        self.length = 0

    @torch.inference_mode()
    def __call__(self, tokens: Tensor, last: int) -> Tensor:
        """tokens: [B, k] at positions length … length+k-1 -> logits [B, last, V] of the final rows."""
        out = self.model.model.decoder(
            input_ids=tokens,
            encoder_hidden_states=self.states,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        self.length += tokens.shape[1]
        return self.model.proj_out(out.last_hidden_state[:, -last:])

    def rollback(self, length: int) -> None:
        if length < self.length:
            self.cache.crop(length - self.length)  # negative: drop that many trailing positions
            self.length = length

    def keep(self, rows: Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.states = self.states[rows]

    def cache_prefix(self) -> list[Tensor]:
        return [t for layer in self.cache.self_attention_cache.layers for t in (layer.keys, layer.values)]


def make_runner(model, encoder_states: Tensor, target: Runner | None = None) -> Runner:
    """The runner for a model: a distilled draft brings its own; a Whisper model in fp32 on
    CPU gets `LeanRunner` over its `LeanDecoder` view (same function, faster products);
    anything else gets `DecoderRunner`. target: the target's runner, whose cross K/V a
    distilled draft on the same states may reuse."""
    if isinstance(model, BringsRunner):
        shared = isinstance(target, LeanRunner) and target.states is encoder_states
        return model.runner(encoder_states, target.cross if shared else None)
    if LeanDecoder.supports(model):
        return LeanRunner(lean_decoder(model), encoder_states)
    return DecoderRunner(model, encoder_states)
