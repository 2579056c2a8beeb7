"""Whisper's logit filters, applied per position.

Each filter edits logits in place given the token context each row was computed from.
The speculative loop calls them on γ+1 target rows and γ draft rows at once, where row i
of a proposal has the context ``prefix + d1 … di``; autoregressive decoding calls them on
one row per sequence. The same filters on the same contexts are what make speculative
output identical to target-only output.

A distilled draft scores only its own vocabulary (`models.draft`: every other token has
probability 0), so its rows can stay reduced [n_rows, N]: `on_vocab` restates a chain for
rows whose column j scores token ids[j], with ids ascending. It leaves the same finite logits
as filtering the full row, at a third of the width.
"""

from __future__ import annotations

import copy
import math
from bisect import bisect_left
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

    def on_vocab(self, ids: list[int]) -> LogitFilter:
        """This filter on reduced rows: column j scores token ids[j] (ids ascending)."""
        raise NotImplementedError


def _columns(ids: list[int], tokens: Sequence[int]) -> list[int]:
    """The columns of reduced rows (ids ascending) that score any of `tokens`."""
    wanted = set(tokens)
    cols = (bisect_left(ids, t) for t in sorted(wanted))
    return [j for j in cols if j < len(ids) and ids[j] in wanted]


class SuppressTokens(LogitFilter):
    """Never emit these tokens (non-speech symbols and the task/control tokens)."""

    def __init__(self, token_ids: Sequence[int], vocab_size: int) -> None:
        self.ids = torch.tensor(sorted({t for t in token_ids if 0 <= t < vocab_size}), dtype=torch.long)
        self._on: dict[torch.device, Tensor] = {}

    def apply(self, logits: Tensor, contexts: Sequence[Sequence[int]]) -> None:
        ids = self._on.get(logits.device)
        if ids is None:
            ids = self._on[logits.device] = self.ids.to(logits.device)
        logits.index_fill_(1, ids, NEG_INF)  # a fill, where logits[:, ids] = … is an indexed put

    def on_vocab(self, ids: list[int]) -> SuppressTokens:
        cols = _columns(ids, self.ids.tolist())
        return SuppressTokens(cols, len(ids))


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

    def on_vocab(self, ids: list[int]) -> SuppressAtBegin:
        return SuppressAtBegin(_columns(ids, self.ids), self.sample_begin)


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

    _ids: list[int] | None = None  # reduced rows: the token each column scores (`on_vocab`)

    def on_vocab(self, ids: list[int]) -> TimestampRules:
        out = copy.copy(self)
        out._ids = ids
        return out

    def _col(self, token: int) -> int:
        """The first column scoring `token` or a later one: the token itself on full rows."""
        return token if self._ids is None else bisect_left(self._ids, token)

    def apply(self, logits: Tensor, contexts: Sequence[Sequence[int]]) -> None:
        # contexts hold token ids; slices of `logits` are columns (`_col`: the same on full rows)
        col, tb = self._col, self.ts_begin
        no_ts = col(self.no_timestamps)
        if self._ids is None or (no_ts < len(self._ids) and self._ids[no_ts] == self.no_timestamps):
            logits.select(1, no_ts).fill_(NEG_INF)
        ctb = col(tb)
        for k, ctx in enumerate(contexts):
            n = len(ctx) - self.sample_begin  # sampled tokens: ctx[sample_begin:], not copied
            row = logits[k]
            last_ts = n >= 1 and ctx[-1] >= tb
            penultimate_ts = n < 2 or ctx[-2] >= tb
            if last_ts:
                if penultimate_ts:  # a closed pair: text (or eot) must follow
                    row[ctb:] = NEG_INF
                else:  # an open timestamp: close it with a timestamp or end
                    row[: col(self.eot)] = NEG_INF
            # the latest sampled timestamp, searched from the end (segments are short)
            stamp = next((ctx[i] for i in range(len(ctx) - 1, len(ctx) - 1 - n, -1) if ctx[i] >= tb), None)
            if stamp is not None:
                # never go back in time; after an open timestamp, a zero-length segment is allowed
                floor = stamp if last_ts and not penultimate_ts else stamp + 1
                row[ctb : col(floor)] = NEG_INF
            if n <= 0:
                row[:ctb] = NEG_INF
                if self.max_initial_index is not None:
                    row[col(tb + self.max_initial_index + 1) :] = NEG_INF
        # if timestamps as a whole are likelier than any single text token, emit a timestamp:
        # log Σ_ts p > max_text log p, where the normaliser cancels, so no log-softmax over V.
        # log Σ_ts p lies in [max_ts, max_ts + log n_ts]: only a row whose text maximum falls in
        # that band needs the sum (the same decisions, for two maxima instead of a logsumexp)
        n_ts = logits.shape[1] - ctb
        if n_ts <= 0:  # reduced rows with no timestamp column: Σ_ts p = 0 never wins
            return
        maxima = torch.stack([logits[:, ctb:].amax(dim=-1), logits[:, :ctb].amax(dim=-1)], 1)
        slack = math.log(n_ts) + 1e-3  # log n_ts, and float rounding
        for k, (t, m) in enumerate(maxima.tolist()):  # [k][max_ts, max_text]: one device read
            if t > m or (t + slack >= m and torch.logsumexp(logits[k, ctb:].float(), dim=-1).item() > m):
                logits[k, :ctb] = NEG_INF


def timestamp_rules_on_device(
    rules: TimestampRules,
    logits: Tensor,
    tokens: Tensor,
    context: Tensor,
    columns: Tensor | None = None,
    n_ts: int | None = None,
    begin: int | Tensor | None = None,
) -> Tensor:
    """`TimestampRules.apply` as tensor operations (no host read: capture-safe), for loops that
    keep contexts on the device (`decode.graphed`). logits [R, V'] (V' = V, or a reduced
    draft's N columns scoring the ascending tokens `columns`, of which the last `n_ts` are
    timestamps: a count the caller knows, not read back here); begin: where sampling starts
    (a 0-dim tensor where it changes from decode to decode; None: the rule's own); tokens
    [R, S]: row r's context is tokens[r, :context[r]] (positions past it are ignored),
    context [R] long. Returns the
    filtered logits: the same decisions as the host rule, which also searches the latest
    timestamp among the sampled tokens and compares log Σ_ts p with the best text token."""
    R, S = tokens.shape
    dev = tokens.device
    tb = rules.ts_begin
    begin = rules.sample_begin if begin is None else begin
    tok = torch.arange(logits.shape[-1], device=dev) if columns is None else columns  # [V'] token ids
    n = context - begin  # [R] sampled tokens
    at = lambda k: tokens.gather(1, (context - k).clamp(min=0)[:, None])[:, 0]  # noqa: E731
    last_ts = (n >= 1) & (at(1) >= tb)
    pen_ts = (n < 2) | (at(2) >= tb)
    pos = torch.arange(S, device=dev)
    sampled = (pos >= begin) & (pos < context[:, None])  # [R, S]
    where = torch.where(sampled & (tokens >= tb), pos, -1).amax(1)  # [R] latest timestamp's position
    stamp = tokens.gather(1, where.clamp(min=0)[:, None])[:, 0]
    floor = torch.where(last_ts & ~pen_ts, stamp, stamp + 1)  # [R]
    is_ts, text = tok >= tb, tok < tb  # [V']
    mask = (tok == rules.no_timestamps).expand(R, -1)
    mask = mask | ((last_ts & pen_ts)[:, None] & is_ts)  # a closed pair: text or eot follows
    mask = mask | ((last_ts & ~pen_ts)[:, None] & (tok < rules.eot))  # an open timestamp: close or end
    mask = mask | ((where >= 0)[:, None] & is_ts & (tok < floor[:, None]))  # never back in time
    first = text if rules.max_initial_index is None else text | (tok > tb + rules.max_initial_index)
    mask = mask | ((n <= 0)[:, None] & first)
    logits = logits.masked_fill(mask, NEG_INF)
    if columns is None:
        n_ts = logits.shape[-1] - tb
    if n_ts <= 0:
        return logits
    ctb = logits.shape[-1] - n_ts  # timestamp columns are the last (ascending tokens)
    t, m = logits[:, ctb:].amax(-1), logits[:, :ctb].amax(-1)
    lse = torch.logsumexp(logits[:, ctb:].float(), dim=-1)
    force = (t > m) | ((t + math.log(n_ts) + 1e-3 >= m) & (lse > m))  # [R]: a timestamp must come
    return logits.masked_fill(force[:, None] & text, NEG_INF)


def build_filters(
    tokenizer: Tokenizer,
    *,
    vocab_size: int,
    sample_begin: int,
    suppress_tokens: Sequence[int],
    begin_suppress_tokens: Sequence[int],
    suppress_blank: bool,
    timestamps: bool,
    max_initial_timestamp: float | None = 1.0,
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
        filters.append(TimestampRules(tokenizer, sample_begin, max_initial_timestamp))
    return filters


def apply_filters(filters: Sequence[LogitFilter], logits: Tensor, contexts: Sequence[Sequence[int]]) -> None:
    for f in filters:
        f.apply(logits, contexts)


def on_vocab(filters: Sequence[LogitFilter], ids: list[int]) -> list[LogitFilter]:
    """The chain for reduced rows whose column j scores token ids[j] (ids ascending): the
    finite logits it leaves are those the full chain leaves on the same tokens. The caller
    guarantees the order (`DistilledDraft.reduced_vocab` checks it once)."""
    return [f.on_vocab(ids) for f in filters]


def device_form(filters: Sequence[LogitFilter]) -> bool:
    """Whether loops that keep contexts on the device can apply this chain: static masks
    (`static_masks`) and the timestamp rules' tensor form (`timestamp_rules_on_device`)."""
    return all(isinstance(f, (SuppressTokens, SuppressAtBegin, TimestampRules)) for f in filters)


def static_masks(filters: Sequence[LogitFilter], vocab_size: int, device) -> tuple[Tensor, Tensor]:
    """The chain as two masks [V] bool, for loops that keep contexts on the device
    (`decode.graphed`): tokens always suppressed, and tokens suppressed at the first sampled
    position only (`SuppressAtBegin`). Timestamp rules branch on the context's tokens, so a
    chain with them has no such form (ValueError): `decode.graphed` applies them apart."""
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
