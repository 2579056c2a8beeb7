"""Whisper's search: beam search at T = 0 (`BeamSearch`), best-of sampling above (`best_of`).

Beam search follows openai-whisper's `BeamSearchDecoder`: every beam offers its beam_size + 1
likeliest next tokens, scored by the beam's sum of log-probs plus the token's; of all offers,
ranked, the first beam_size that are not <|endoftext|> are the next beams, and the ones that
end among the first beam_size offers are finished hypotheses (at most round(beam_size *
patience) are kept, in rank order). openai-whisper also keeps ends ranked below beam_size (but
above the last beam kept); CTranslate2 (faster-whisper) and transformers do not, and neither
does this: such a weak end can fill the list and stop the search before a better one. A
window's search ends when that many have finished, or at its token limit, where its running
beams count as finished (in rank order, up to beam_size). The result is the hypothesis with
the highest sum of log-probs / `penalty(length)`. Beams are rows of the batch: a window's rows
follow each other, and a step gathers each beam's KV cache from its parent's row
(`Runner.reorder`).

Speculative beams: the draft proposes γ tokens after every beam (its greedy continuation), the
target scores each beam's row and its proposal in one pass, and the search replays its steps on
those logits. Step t of a window reads beam j's offers at offset t of the row it sits on; a new
beam that extends its parent by the parent's next proposal sits on the same row at offset t+1,
so while every new beam of the window does, the next step needs no new pass. The first new
beam off the proposals (or the limit, or the end of the search) ends the window's replay for
this pass. Every step reads the logits it would read in target-only beam search (the target's
rows in a pass equal its one-token steps, as speculative greedy decoding already needs), so the
beams, hypotheses and result are the same: only the number of target passes changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specasr.constants import N_TEXT_CTX
from specasr.decode.runners import Runner
from specasr.decode.step import Batch, Proposal, SpeculativeStep, StepContext, score


def penalty(length: int, length_penalty: float | None) -> float:
    """Whisper's length normalisation of a hypothesis' sum of log-probs: the length (None), or
    Google NMT's ((5 + length) / 6) ** α."""
    if length_penalty is None:
        return max(length, 1)
    return ((5 + length) / 6) ** length_penalty


def ranked_best(lengths: list[int], logprobs: list[float], length_penalty: float | None) -> int:
    """The index of the best candidate: the highest logprob / penalty(length), the first on ties."""
    scores = [lp / penalty(n, length_penalty) for n, lp in zip(lengths, logprobs)]
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


@dataclass
class Window:
    """One window's search: its running beams (each a context: start sequence + tokens) and the
    hypotheses that finished (context without <|endoftext|> -> sum of log-probs, eot's included)."""

    beams: list[list[int]]
    scores: list[float]
    finished: dict[tuple[int, ...], float] = field(default_factory=dict)
    no_speech: float = math.nan
    done: bool = False
    src: list[int] = field(default_factory=list)  # per new beam: the runner row it descends from
    at: list[int] = field(default_factory=list)  # per beam: its offset on that row's proposal
    parents: list[tuple[int, int]] = field(default_factory=list)  # per beam: (parent beam, its token)

    def advance(self, offers: list[list[tuple[float, int]]], beam_size: int, most: int, eot: int) -> None:
        """offers[j]: beam j's beam_size + 1 likeliest (log-prob, token) -> the next beams (as
        (parent, token) in `self.parents`) and newly finished hypotheses; `done` once `most`
        have finished."""
        ranked = [(s + lp, j, t) for j, s in enumerate(self.scores) for lp, t in offers[j]]
        ranked.sort(key=lambda c: c[0], reverse=True)  # stable: ties keep beam order, then rank
        beams, scores, parents, ended = [], [], [], []
        for rank, (total, j, t) in enumerate(ranked):
            if t == eot:
                if rank < beam_size:  # an end ranked below the first beam_size offers is dropped
                    ended.append((total, j))
                continue
            beams.append(self.beams[j] + [t])
            scores.append(total)
            parents.append((j, t))
            if len(beams) == beam_size:
                break
        for total, j in ended:  # already in rank order
            if len(self.finished) >= most:
                break
            self.finished.setdefault(tuple(self.beams[j]), total)
        self.beams, self.scores, self.parents = beams, scores, parents
        self.done = len(self.finished) >= most

    def finalize(self, beam_size: int) -> None:
        """At the token limit: running beams count as finished, in rank order, until there are
        beam_size hypotheses (Whisper's `finalize`)."""
        order = sorted(range(len(self.beams)), key=lambda j: self.scores[j], reverse=True)
        for j in order:
            if len(self.finished) >= beam_size:
                break
            self.finished.setdefault(tuple(self.beams[j]), self.scores[j])
        self.done = True

    def best(self, begin: int, length_penalty: float | None) -> tuple[list[int], float]:
        """The result: (its context, its sum of log-probs); lengths count tokens from `begin`."""
        seqs = list(self.finished)
        i = ranked_best([len(s) - begin for s in seqs], [self.finished[s] for s in seqs], length_penalty)
        return list(seqs[i]), self.finished[seqs[i]]


class BeamSearch:
    """Beam search over a batch of windows, target only or with speculative beams."""

    def __init__(self, ctx: StepContext, target: Runner, step: SpeculativeStep | None, policy=None) -> None:
        """policy: the γ policy (`decode.gamma`) of speculative beams; its backoff judges a
        window's replayed steps as a row's accepted drafts, so where speculation cannot pay
        the passes are the target's alone."""
        self.ctx, self.target, self.step, self.policy = ctx, target, step, policy
        opts = ctx.options
        self.beam_size = opts.beam_size
        self.most = max(round(opts.beam_size * opts.patience), 1)
        self.eot = ctx.pair.tokenizer.eot

    def run(self, windows: int) -> list[Window]:
        """Decodes `windows` windows (the runners' rows, one each) to the end of their search."""
        init = self.ctx.task.init
        all_windows = [Window([list(init)], [0.0]) for _ in range(windows)]
        active = list(all_windows)
        while active:
            gamma = 0
            if self.step is not None and max(self.target.lengths) > 0:  # the first pass is the target's
                wanted = (
                    self.policy.next(sum(len(w.beams) for w in active))
                    if self.policy
                    else self.ctx.options.gamma
                )
                gamma = min(wanted, N_TEXT_CTX - max(len(w.beams[0]) for w in active))
            active = self._pass(active, gamma)
        return all_windows

    def _pass(self, active: list[Window], gamma: int) -> list[Window]:
        ctx, limit = self.ctx, self.ctx.task.limit
        rows = [b for w in active for b in w.beams]
        if self.policy is not None and self.policy.wants_times:
            ctx.clock.flush()
        times = (ctx.stats.draft_s, ctx.stats.target_s)
        batch = Batch.start([], len(rows))
        batch.seqs = [list(b) for b in rows]
        proposal = self.step.propose(batch, gamma) if gamma else Proposal([[] for _ in rows])
        gamma = proposal.gamma
        logits = score(ctx, self.target, batch, proposal)  # [R, γ+1, V], filtered
        width = min(self.beam_size + 1, logits.shape[-1])
        top = torch.log_softmax(logits.float(), dim=-1).topk(width, dim=-1)  # [R, γ+1, width]
        values, ids = top.values.tolist(), top.indices.tolist()  # the pass's one device read
        first, steps = 0, []
        for w in active:
            n = len(w.beams)
            if math.isnan(w.no_speech):
                w.no_speech = batch.no_speech[first]
            w.src, w.at = list(range(first, first + n)), [0] * n
            steps.append(self._replay(w, values, ids, proposal.tokens, gamma, limit))
            first += n
        kept = [w for w in active if not w.done]
        if gamma:  # per window: its steps, of which all but the first read a proposal's rows
            ctx.stats.record_pass(gamma, [s - 1 for s in steps], steps, proposal.stopped)
            if self.policy is not None:
                if self.policy.wants_times:
                    ctx.clock.flush()
                replayed = [s - 1 for s in steps]
                self.policy.update(
                    gamma,
                    min(replayed),
                    ctx.stats.draft_s - times[0],
                    ctx.stats.target_s - times[1],
                    stopped=proposal.stopped,
                    per_row=replayed,
                )
        else:
            ctx.stats.record_step(len(rows))
        src = [r for w in kept for r in w.src]
        lengths = [len(b) - 1 for w in kept for b in w.beams]  # every token but the newest
        runners = [self.target] + ([self.step.draft] if self.step is not None else [])
        same = len(kept) == len(active) and len(src) == len(rows)  # no window ended, none grew
        for runner in runners:
            if same:
                runner.reorder(src)  # within windows: the cross K/V stay
            else:
                runner.keep(src)  # windows ended, or beams were born: rows gathered, cross K/V too
            runner.rollback(lengths)
        return kept

    def _replay(self, w: Window, values, ids, proposals: list[list[int]], gamma: int, limit: int) -> int:
        """Steps the window's search on one pass's offers while its beams stay on the proposals;
        returns the steps made. Leaves `w.src` (each beam's row) for the caches."""
        steps = 0
        while True:
            offers = [list(zip(values[r][t], ids[r][t])) for r, t in zip(w.src, w.at)]
            w.advance(offers, self.beam_size, self.most, self.eot)
            steps += 1
            rows, at, on = [], [], True
            for j, t in w.parents:
                r, o = w.src[j], w.at[j]
                rows.append(r)
                at.append(o + 1)
                on = on and o < gamma and proposals[r][o] == t
            w.src, w.at = rows, at
            if not w.done and len(w.beams[0]) >= limit:
                w.finalize(self.beam_size)
            if w.done or not on:
                return steps


def best_of(sums: list[float], lengths: list[int], n: int, length_penalty: float | None) -> list[int]:
    """Rows of windows sampled n times each (window k's at k*n … k*n+n-1) -> per window the
    row of its best sample (Whisper's ranking: sum of log-probs / penalty(length))."""
    return [
        k + ranked_best(lengths[k : k + n], sums[k : k + n], length_penalty) for k in range(0, len(sums), n)
    ]


__all__ = ["BeamSearch", "Window", "best_of", "penalty", "ranked_best"]
