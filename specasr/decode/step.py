"""One step of the decoding loop: target only, or speculative in four phases.

The speculative step (Leviathan et al.; gpt-fast's shape):

1. `propose`: the draft proposes d1 … dγ from its own KV cache (argmax, or a sample from
   q = softmax(filtered draft logits / T)); the stop policy may end the run early.
2. `score`: the target runs once on [last token, d1 … dγ] and yields γ+1 logit rows, each
   filtered with its own context prefix + d1 … di (`filters.py`).
3. `verify`: `specasr.kernels.verify` accepts n of the drafts per row and draws one more
   token. Token kinds (`TOKEN_KINDS`): *accepted* drafts, a *corrected* token at the
   first rejection (drawn from norm(max(0, p − q))), or a *bonus* token when all γ were
   accepted (drawn from p at row γ).
4. `commit`: each row b appends its own n_b accepted drafts and the verifier's token, and
   both KV caches roll back, row by row, to the accepted prefix. Rows are ragged: every
   row keeps everything it accepted, whatever the others accepted. All rows share γ and
   the stop policy, so at a fixed γ without a draft stop a row runs exactly the passes it
   would run alone. Each row's tokens are a speculative sample, distributed as the
   target's, and at T = 0 they are its greedy sequence.

Ragged rows sit at different positions. A runner keeps a length per row and writes each
row's keys and values at its own positions behind a per-row mask (`specasr.runtime.runner`).
Every pass still feeds a rectangle [B, k]: the target's rows always have the same number
of new tokens, and a draft row with fewer new tokens than the others re-feeds cached ones
(`feed`). Rows at one length (always at B = 1) take the uniform path of one slice and one
causal mask.

Randomness comes from one seeded generator, so `baseline` and `exact` draw the same tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specasr import kernels
from specasr.decode.filters import LogitFilter, apply_filters, on_vocab
from specasr.decode.race import KeyedRace, race_pick
from specasr.decode.runners import Runner
from specasr.decode.stop import DraftStop
from specasr.decode.task import Task
from specasr.kernels._common import first_argmax
from specasr.options import DecodeOptions
from specasr.stats import Clock, DecodeStats

# Where each emitted token came from: a draft token the verifier accepted; the verifier's
# token at the first rejection ("corrected", drawn from norm(max(0, p − q))); its token after
# all γ were accepted ("bonus", drawn from p); or a target-only step.
TOKEN_KINDS = ("draft", "corrected", "bonus", "target")


def pick(logits: Tensor, temperature: float, gen: torch.Generator) -> Tensor:
    """logits [N, V] -> tokens [N]: argmax at T = 0, else the exponential race
    argmax(softmax(l/T) / E), E ~ Exp(1), an exact sample from softmax(l/T)."""
    if temperature == 0:
        return first_argmax(logits)
    noise = torch.empty(logits.shape, device=logits.device, dtype=torch.float32).exponential_(generator=gen)
    noise.clamp_(min=torch.finfo(torch.float32).tiny)  # an Exp(1) draw of exactly 0 must not win
    return (logits.float() / temperature - noise.log()).argmax(dim=-1)


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """logits [..., V], tokens [...] -> log softmax(logits)[token], float32 [...]."""
    rows = logits.float()
    return rows.gather(-1, tokens[..., None])[..., 0] - torch.logsumexp(rows, -1)


@dataclass
class Batch:
    """Every row's context and scores; `active` are the rows still decoding (ragged lengths)."""

    seqs: list[list[int]]  # per row: start sequence + every token emitted so far
    sum_logprob: list[float]  # per row: target log-probs of the emitted tokens
    no_speech: list[float]  # per row: P(<|nospeech|>) at the sot position, once known
    active: list[int]
    kinds: list[list[str]]  # per row, per emitted token: one of TOKEN_KINDS

    @classmethod
    def start(cls, init: list[int], rows: int) -> Batch:
        return cls(
            [list(init) for _ in range(rows)],
            [0.0] * rows,
            [math.nan] * rows,
            list(range(rows)),
            [[] for _ in range(rows)],
        )

    @property
    def lengths(self) -> list[int]:
        """Per active row: the context's length."""
        return [len(self.seqs[r]) for r in self.active]

    def contexts(self, extra: list[list[int]] | None = None) -> list[list[int]]:
        """The active rows' contexts, each followed by its row of `extra`."""
        return [self.seqs[r] + (extra[j] if extra else []) for j, r in enumerate(self.active)]

    def set_no_speech(self, logits: Tensor, no_speech_id: int) -> None:
        """logits [B, k, V] of a first pass whose row 0 is the sot position."""
        probs = torch.softmax(logits[:, 0].float(), dim=-1)[:, no_speech_id].tolist()
        for r, p in zip(self.active, probs):
            self.no_speech[r] = p

    def finish(self, eot: int, limit: int) -> list[int]:
        """Drops rows that ended (eot or the token limit); returns the kept indices into the
        old `active`, for the runners' `keep`."""
        kept = [j for j, r in enumerate(self.active) if self.seqs[r][-1] != eot and len(self.seqs[r]) < limit]
        self.active = [self.active[j] for j in kept]
        return kept


def feed(runner: Runner, contexts: list[list[int]], device) -> Tensor:
    """The tokens [B, k] a runner has yet to see: row b's context from lengths[b] on. A row
    with fewer new tokens than the most, k, starts earlier and re-feeds cached ones (its
    cache rolls back), so the block stays rectangular: no padding, and every row's newest
    logits are the block's last. Only the draft re-feeds: the target's rows always have the
    same number of new tokens, and a draft row lags by one after it accepted every proposal."""
    k = max(len(c) - n for c, n in zip(contexts, runner.lengths))
    runner.rollback([len(c) - k for c in contexts])
    return torch.tensor([c[-k:] for c in contexts], dtype=torch.long, device=device)


@dataclass
class Proposal:
    """The draft's run: per active row d1 … dγ, and the filtered rows they came from."""

    tokens: list[list[int]]  # [B][γ]
    logits: list[Tensor] = field(default_factory=list)  # γ × [B, V], or [B, N] over `columns`
    stopped: bool = False  # the stop policy ended the run before the γ asked for
    columns: Tensor | None = None  # [N]: a reduced-vocabulary draft's tokens, one per column

    @property
    def gamma(self) -> int:
        return len(self.logits)

    def full_logits(self, vocab_size: int) -> Tensor:
        """The rows over the whole vocabulary, [B, γ, V]: a reduced draft's are −inf off its
        columns (what the verifier's q is)."""
        rows = torch.stack(self.logits, dim=1)  # [B, γ, V or N]
        if self.columns is None:
            return rows
        out = rows.new_full((*rows.shape[:-1], vocab_size), -math.inf)
        return out.index_copy_(-1, self.columns, rows)


@dataclass
class Pass:
    """What one speculative pass did, given to `Hooks.on_pass` after the commit."""

    batch: Batch  # its `active` are still the rows of this pass
    proposal: Proposal
    accepted: list[int]  # per active row: drafts the verifier accepted
    advanced: list[int]  # per active row: tokens appended (accepted + 1; fewer if cut at eot or the limit)
    target: Runner
    draft: Runner


@dataclass
class Hooks:
    """Public hooks into the loop, for tests and research tools."""

    stop: DraftStop | None = None  # replaces the stop policy made from DecodeOptions.draft_stop
    on_pass: Callable[[Pass], None] | None = None  # called after every speculative pass


@dataclass
class StepContext:
    """What every step of one decode shares."""

    pair: object
    options: DecodeOptions
    task: Task
    stats: DecodeStats
    clock: Clock
    gen: torch.Generator
    # the coupled rule's keyed noise (decode/race.py), when it samples (T > 0); None: draws from `gen`
    race: KeyedRace | None = None

    _draft: tuple = field(default=(), init=False, repr=False)  # (vocab, its filter chain)

    @property
    def filters(self) -> list[LogitFilter]:
        return self.task.filters

    def draft_filters(self, vocab: list[int]) -> list[LogitFilter]:
        """The task's filters on a reduced draft's rows (column j scores vocab[j]), built once."""
        if not self._draft or self._draft[0] is not vocab:
            self._draft = (vocab, on_vocab(self.task.filters, vocab))
        return self._draft[1]

    def pick(
        self, logits: Tensor, rows: list[int], positions: list[int], columns: Tensor | None = None
    ) -> Tensor:
        """logits [N, C] of rows `rows` at `positions` -> tokens [N] (columns of `logits`;
        `columns` [C]: the token each scores, for a reduced draft): the argmax at T = 0, else the
        exponential race, with each position's keyed noise under the coupled rule."""
        temperature = self.options.temperature
        if temperature == 0 or self.race is None:
            return pick(logits, temperature, self.gen)
        noise = self.race.gumbel(rows, positions)  # [N, V]
        return race_pick(logits, temperature, noise if columns is None else noise[:, columns])

    def first_pass(self, target: Runner, batch: Batch) -> int | None:
        """On the window's first target pass: how many final rows to score so that row 0 is
        the sot position (the prompt before it is not scored); None on later passes."""
        if max(target.lengths) > 0:
            return None
        return len(batch.seqs[batch.active[0]]) - self.task.sot_index  # every row holds the start sequence


def target_step(ctx: StepContext, batch: Batch, target: Runner) -> None:
    """Target only: one token for every active row."""
    first = ctx.first_pass(target, batch)
    with ctx.clock.phase("target_s"), ctx.clock.phase("window_s" if first else None):
        contexts = batch.contexts()
        logits = target(feed(target, contexts, ctx.pair.device), first or 1)  # [B, k, V]
        if first:
            batch.set_no_speech(logits, ctx.pair.tokenizer.no_speech)
        rows = logits[:, -1].contiguous()  # [B, V]
        apply_filters(ctx.filters, rows, contexts)
    tok = ctx.pick(rows, batch.active, [len(batch.seqs[r]) for r in batch.active])  # [B]
    for r, t, lp in zip(batch.active, tok.tolist(), token_logprobs(rows, tok).tolist()):
        batch.seqs[r].append(t)  # the cache now holds every token but this newest one
        batch.sum_logprob[r] += lp
        batch.kinds[r].append("target")
    ctx.stats.record_step(len(batch.active))


def score(ctx: StepContext, target: Runner, batch: Batch, proposal: Proposal) -> Tensor:
    """The target's filtered logits [B, γ+1, V] on each active row's context followed by its
    proposal d1 … dγ (γ may be 0): row i was computed after d1 … di."""
    gamma, B = proposal.gamma, len(batch.active)
    first = ctx.first_pass(target, batch)
    with ctx.clock.phase("target_s"), ctx.clock.phase("window_s" if first else None):
        full = batch.contexts(proposal.tokens)
        tokens = feed(target, full, ctx.pair.device)  # [B, γ+1], or the start sequence + γ
        logits = target(tokens, (first + gamma) if first else gamma + 1)  # [B, k, V]
        if first:
            batch.set_no_speech(logits, ctx.pair.tokenizer.no_speech)
        logits = logits[:, -(gamma + 1) :].contiguous()  # [B, γ+1, V]
        contexts = [c[: len(c) - gamma + i] for c in full for i in range(gamma + 1)]
        apply_filters(ctx.filters, logits.view(B * (gamma + 1), -1), contexts)
    return logits


class SpeculativeStep:
    """propose → score → verify → commit, over one batch's target and draft runners."""

    def __init__(self, ctx: StepContext, target: Runner, draft: Runner, stop: DraftStop) -> None:
        self.ctx, self.target, self.draft, self.stop = ctx, target, draft, stop

    def __call__(self, batch: Batch, gamma: int) -> Pass:
        proposal = self.propose(batch, gamma)
        logits = self.score(batch, proposal)
        accepted, nxt = self.verify(logits, proposal, batch)
        advanced = self.commit(batch, proposal, logits, accepted, nxt)
        return Pass(batch, proposal, accepted, advanced, self.target, self.draft)

    def propose(self, batch: Batch, gamma: int) -> Proposal:
        """Up to γ draft tokens per row; the stop policy may end the run early. A distilled
        draft's rows stay over its own vocabulary (a third of V for base's): its filters,
        pick and stop read [B, N], and the verifier gets the full rows once per pass."""
        ctx, draft = self.ctx, self.draft
        vocab = getattr(draft, "vocab", None)  # the token of each reduced column, or None
        filters = ctx.filters if vocab is None else ctx.draft_filters(vocab)
        reduced = {} if vocab is None else {"reduced": True}
        proposal = Proposal([[] for _ in batch.active], columns=None if vocab is None else draft.columns)
        with ctx.clock.phase("draft_s"):
            for i in range(gamma):
                contexts = batch.contexts(proposal.tokens)  # one copy serves the feed and the filters
                rows = draft(feed(draft, contexts, ctx.pair.device), 1, **reduced)[:, -1].contiguous()
                apply_filters(filters, rows, contexts)  # rows [B, V], or [B, N]
                positions = [len(batch.seqs[r]) + i for r in batch.active]
                picked = ctx.pick(rows, batch.active, positions, proposal.columns)  # [B] columns of rows
                for j, c in enumerate(picked.tolist()):  # the host-side filters need the tokens
                    proposal.tokens[j].append(c if vocab is None else vocab[c])
                proposal.logits.append(rows)
                if i + 1 < gamma and self.stop.stop(rows, picked):
                    proposal.stopped = True
                    break
        return proposal

    def score(self, batch: Batch, proposal: Proposal) -> Tensor:
        """The target's filtered logits [B, γ+1, V]: row i was computed after d1 … di."""
        return score(self.ctx, self.target, batch, proposal)

    def verify(self, logits: Tensor, proposal: Proposal, batch: Batch) -> tuple[list[int], list[int]]:
        """(accepted count per row, the verifier's next token per row): one device read. Under
        the coupled rule (decode/race.py) a sampled pass is argmax matching on the target's raced
        rows l / T + G, with each position's keyed noise G, as the draft's proposals were picked."""
        ctx, opts = self.ctx, self.ctx.options
        dev = logits.device
        B, gamma, V = logits.shape[0], proposal.gamma, logits.shape[-1]
        draft_tokens = torch.tensor(proposal.tokens, dtype=torch.long, device=dev)  # [B, γ]
        temperature = opts.temperature
        if temperature > 0 and ctx.race is not None:
            rows = [r for r in batch.active for _ in range(gamma + 1)]
            positions = [len(batch.seqs[r]) + i for r in batch.active for i in range(gamma + 1)]
            noise = ctx.race.gumbel(rows, positions).view(B, gamma + 1, V)
            logits, temperature = logits.float() / temperature + noise, 0.0  # [B, γ+1, V] raced
        if temperature > 0:
            uniforms, noise = kernels.make_randomness(B, gamma, V, ctx.gen, dev)
            draft_rows = proposal.full_logits(V)  # [B, γ, V]
        else:  # every mode is argmax matching at T = 0: nothing reads q, r or the noise, so
            # they are broadcast views, not γ·V floats written per pass
            uniforms = logits.new_zeros((1, 1), dtype=torch.float32).expand(B, gamma)
            noise = logits.new_ones((1, 1), dtype=torch.float32).expand(B, V)
            draft_rows = logits.new_full((1, 1, 1), -math.inf).expand(B, gamma, V)
        with ctx.clock.phase("verify_s"):
            n_acc, nxt = kernels.verify(
                logits,
                draft_rows,  # [B, γ, V]
                draft_tokens,
                uniforms,
                noise,
                temperature=temperature,
                mode=opts.mode,
                sigmoid_scale=opts.sigmoid_scale,
                backend=opts.backend,
            )
        accepted, nxt = torch.stack([n_acc, nxt]).tolist()  # the step's one device-to-host read
        return accepted, nxt

    def commit(
        self, batch: Batch, proposal: Proposal, logits: Tensor, accepted: list[int], nxt: list[int]
    ) -> list[int]:
        """Appends to each row b its accepted d1 … dn_b and the verifier's token (cut at eot
        and at the token limit), records the pass and rolls both caches back, row by row, to
        the new prefix; returns each row's count of tokens appended."""
        ctx, eot, gamma = self.ctx, self.ctx.pair.tokenizer.eot, proposal.gamma
        lengths, limit = batch.lengths, ctx.task.limit
        new = [d[:n] + [t] for d, n, t in zip(proposal.tokens, accepted, nxt)]  # ragged: n_b + 1 each
        k = max(accepted) + 1
        ids = torch.tensor(
            [row + [0] * (k - len(row)) for row in new], dtype=torch.long, device=logits.device
        )
        lps = token_logprobs(logits[:, :k], ids).tolist()  # [B][k]: row i scores the token after d1 … di
        emitted = []
        for j, r in enumerate(batch.active):
            toks = new[j][: new[j].index(eot) + 1] if eot in new[j] else new[j]
            toks = toks[: limit - lengths[j]]  # a prefix of a speculative sample is one too
            kinds = ["draft"] * accepted[j] + ["bonus" if accepted[j] == gamma else "corrected"]
            batch.kinds[r] += kinds[: len(toks)]
            batch.seqs[r] += toks
            batch.sum_logprob[r] += sum(lps[j][: len(toks)])
            emitted.append(len(toks))
        ctx.stats.record_pass(gamma, accepted, emitted, proposal.stopped)
        kept = [L + e - 1 for L, e in zip(lengths, emitted)]  # every token but the newest
        self.target.rollback(kept)
        self.draft.rollback(kept)  # (never forward: a draft row may hold fewer)
        return emitted
