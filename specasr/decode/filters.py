"""Whisper's logit filters, applied per position.

Each filter edits logits in place given the token context each row was computed from.
The speculative loop calls them on γ+1 target rows and γ draft rows at once, where row i
of a proposal has the context ``prefix + d1 … di``; autoregressive decoding calls them on
one row per sequence. The same filters on the same contexts are what make speculative
output identical to target-only output.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from specasr.constants import SECONDS_PER_TIMESTAMP
from specasr.tokenizer import Tokenizer

NEG_INF = float("-inf")


class LogitFilter:
    def apply(self, logits: Tensor, contexts: Sequence[Sequence[int]]) -> None:
        """logits: Tensor, shape = (n_rows, vocab); contexts: n_rows token lists (prompt included)."""
        raise NotImplementedError


class SuppressTokens(LogitFilter):
    """Never emit these tokens (non-speech symbols and the task/control tokens)."""

    def __init__(self, token_ids: Sequence[int], vocab_size: int) -> None:
        self.ids = torch.tensor(sorted({t for t in token_ids if 0 <= t < vocab_size}), dtype=torch.long)
        self._on: dict[torch.device, Tensor] = {}

    def apply(self, logits: Tensor, contexts: Sequence[Sequence[int]]) -> None:
        ids = self._on.get(logits.device)
        if ids is None:
            ids = self._on[logits.device] = self.ids.to(logits.device)
        logits[:, ids] = NEG_INF


class SuppressAtBegin(LogitFilter):
    """At the first sampled position, suppress blank (" ") and <|endoftext|>."""

    def __init__(self, token_ids: Sequence[int], sample_begin: int) -> None:
        self.ids = list(token_ids)
        self.sample_begin = sample_begin

    def apply(self, logits: Tensor, contexts: Sequence[Sequence[int]]) -> None:
        rows = [i for i, c in enumerate(contexts) if len(c) == self.sample_begin]
        if rows:
            logits[
                torch.tensor(rows, device=logits.device)[:, None],
                torch.tensor(self.ids, device=logits.device),
            ] = NEG_INF


class TimestampRules(LogitFilter):
    """Whisper's timestamp grammar: timestamps come in pairs, never decrease, and the first
    sampled token is a timestamp no later than `max_initial_timestamp` seconds."""

    def __init__(
        self, tokenizer: Tokenizer, sample_begin: int, max_initial_timestamp: float | None = 1.0
    ) -> None:
        self.eot = tokenizer.eot
        self.no_timestamps = tokenizer.no_timestamps
        self.ts_begin = tokenizer.timestamp_begin
        self.sample_begin = sample_begin
        self.max_initial_index = (
            None if max_initial_timestamp is None else round(max_initial_timestamp / SECONDS_PER_TIMESTAMP)
        )

    def apply(self, logits: Tensor, contexts: Sequence[Sequence[int]]) -> None:
        logits.select(1, self.no_timestamps).fill_(NEG_INF)
        tb = self.ts_begin
        for k, ctx in enumerate(contexts):
            sampled = ctx[self.sample_begin :]
            row = logits[k]
            last_ts = len(sampled) >= 1 and sampled[-1] >= tb
            penultimate_ts = len(sampled) < 2 or sampled[-2] >= tb
            if last_ts:
                if penultimate_ts:  # a closed pair: text (or eot) must follow
                    row[tb:] = NEG_INF
                else:  # an open timestamp: close it with a timestamp or end
                    row[: self.eot] = NEG_INF
            stamps = [t for t in sampled if t >= tb]
            if stamps:
                # never go back in time; after an open timestamp, a zero-length segment is allowed
                floor = stamps[-1] if last_ts and not penultimate_ts else stamps[-1] + 1
                row[tb:floor] = NEG_INF
            if not sampled:
                row[:tb] = NEG_INF
                if self.max_initial_index is not None:
                    row[tb + self.max_initial_index + 1 :] = NEG_INF
        # if timestamps as a whole are likelier than any single text token, emit a timestamp:
        # log Σ_ts p > max_text log p, where the normaliser cancels, so no log-softmax over V
        ts_mass = torch.logsumexp(logits[:, tb:].float(), dim=-1)  # [k]
        text_max = logits[:, :tb].float().amax(dim=-1)  # [k]
        for k in torch.nonzero(ts_mass > text_max).flatten().tolist():  # a row loop beats a mask index
            logits[k, :tb] = NEG_INF


def build_filters(
    tokenizer: Tokenizer,
    *,
    vocab_size: int,
    sample_begin: int,
    suppress_tokens: Sequence[int],
    begin_suppress_tokens: Sequence[int],
    suppress_blank: bool,
    timestamps: bool,
) -> list[LogitFilter]:
    """The filter chain for one decoding task, in Whisper's order."""
    filters: list[LogitFilter] = []
    if suppress_blank:
        filters.append(SuppressAtBegin(begin_suppress_tokens, sample_begin))
    control = [
        tokenizer.sot,
        tokenizer.sot_prev,
        tokenizer.sot_lm,
        tokenizer.transcribe,
        tokenizer.translate,
        tokenizer.no_speech,
    ]
    filters.append(SuppressTokens(list(suppress_tokens) + control, vocab_size))
    if timestamps:
        filters.append(TimestampRules(tokenizer, sample_begin))
    return filters


def apply_filters(filters: Sequence[LogitFilter], logits: Tensor, contexts: Sequence[Sequence[int]]) -> None:
    for f in filters:
        f.apply(logits, contexts)


def static_masks(filters: Sequence[LogitFilter], vocab_size: int, device) -> tuple[Tensor, Tensor]:
    """The chain as two masks [V] bool, for loops that keep contexts on the device
    (`decode.graphed`): tokens always suppressed, and tokens suppressed at the first sampled
    position only (`SuppressAtBegin`). Timestamp rules branch on the context's tokens, so a
    chain with them has no such form (ValueError)."""
    always = torch.zeros(vocab_size, dtype=torch.bool)
    at_begin = torch.zeros(vocab_size, dtype=torch.bool)
    for f in filters:
        if isinstance(f, SuppressTokens):
            always[f.ids] = True
        elif isinstance(f, SuppressAtBegin):
            at_begin[[t for t in f.ids if 0 <= t < vocab_size]] = True
        else:
            raise ValueError(f"{type(f).__name__} depends on the context's tokens: no static mask")
    return always.to(device), at_begin.to(device)
