"""Capture-safe greedy decoding: fixed shapes, state on the device, one host read per step.

The host loop (`decode.loop`, `decode.step`) keeps each row's context as a Python list,
reads every draft token back to the host, and feeds passes whose shapes follow the rows'
lengths. On a CPU that costs nothing. On a GPU every read is a synchronisation, and a pass
whose shapes change cannot be replayed from a CUDA graph (issue 21). This module is the
same algorithm at T = 0 with all per-step state on the device:

- **Context:** `seq` [B, 448] and the lengths `L` [B].
- **Caches:** the runners' preallocated K/V [B, H, 448, dh] (`cpu.lean.LeanRunner`). Each
  pass writes a token's keys and values at its own position and attends over all 448
  positions behind a mask (key position ≤ query position). Entries past a row's length are
  stale and masked, then overwritten: rollback is free, and no shape depends on a length.
- **The draft** starts each step by feeding the last two context tokens (T = 2). So it never
  needs to know whether it saw the previous step's last draft token: rewriting a cached
  token's keys at the same position is harmless.
- **Filters** become two masks (`filters.static_masks`): suppressed always, and suppressed at
  the first sampled position. The timestamp rules branch on the context's tokens, so a task
  with timestamps is refused here and stays on the host loop.
- **Acceptance:** n = number of leading drafts equal to the target's argmax. The next token
  is the target's argmax at n. n is cut at a drafted <|endoftext|> (the target's token there
  is the same eot, so it becomes the next token), and so that no row passes its limit.

One host read per step: the rows' [accepted | done] flags, for stopping and statistics.

Every pass has fixed shapes for a given (B, γ): draft T = 2, draft T = 1, target T = γ + 1
(γ = 0 is target-only decoding). On CUDA each pass can be captured once as a graph and
replayed. That capture needs a GPU and is not written yet. On a CPU the passes run eagerly,
and the tests check that their tokens are the host loop's, and that no step reads a value
back other than through `Steps.read`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from specasr.constants import N_TEXT_CTX
from specasr.cpu.lean import LeanRunner
from specasr.decode.filters import static_masks
from specasr.decode.runners import make_runner
from specasr.decode.task import Task, task_language
from specasr.options import DecodeOptions


def _argmax(x: Tensor) -> Tensor:
    """[..., V] -> [...]: the first maximal index, as the host loop's `first_argmax`, which on
    a CPU goes through numpy (a host tensor made per call: not capture-safe)."""
    return torch.argmax(x, dim=-1)


@torch.inference_mode()
def fixed_pass(runner: LeanRunner, tokens: Tensor, pos: Tensor) -> Tensor:
    """tokens, pos [B, T] (each token's own position, < 448) -> logits [B, T, V]. Writes the
    tokens' keys and values at `pos`; query (b, i) attends keys at positions ≤ pos[b, i].
    Shapes depend on B and T only; `runner.lengths` is neither read nor changed."""
    dec, K0 = runner.decoder, runner.k[0]
    (B, T), dev = tokens.shape, tokens.device
    mask = (torch.arange(N_TEXT_CTX, device=dev) <= pos[..., None])[:, None]  # [B, 1, T, 448]
    write = pos[:, None, :, None].expand(B, K0.shape[1], T, K0.shape[3])  # [B, H, T, dh]
    x = dec.embed(tokens, pos)  # [B, T, d]
    for layer, K, V, (ck, cv) in zip(dec.layers, runner.k, runner.v, runner.cross):
        x = layer(x, ck, cv, mask, cache=(K, V), start=N_TEXT_CTX - T, write=write)
    return dec.logits(x)


@dataclass
class Steps:
    """Device-side decoding state of B rows that share a task, and its statistics."""

    seq: Tensor  # [B, 448] long: prompt + sampled tokens (past L: stale)
    lengths: Tensor  # [B] long: context length L
    done: Tensor  # [B] bool
    sum_logprob: Tensor  # [B] float32: target log-probs of the sampled tokens (eot included)
    no_speech: Tensor  # [B] float32: P(<|nospeech|>) after <|startoftranscript|>
    reads: int = 0  # host reads so far (one per step)
    passes: int = 0  # target passes (steps)
    proposed: int = 0  # draft tokens proposed to live rows
    accepted: int = 0
    history: list[list[int]] = field(default_factory=list)  # per step: accepted per row (-1: done)

    def read(self, n: Tensor, live: Tensor) -> list[int]:
        """The step's only device -> host read: accepted counts [B] and the done flags."""
        host = torch.cat([torch.where(live, n, -1), self.done.long()]).tolist()
        self.reads += 1
        B = len(host) // 2
        self.history.append(host[:B])
        return host


class GraphedGreedy:
    """Greedy decoding (γ > 0: speculative with the pair's draft; γ = 0: target only) with the
    passes `fixed_pass` runs. Tokens are the target's greedy tokens, as the host loop's."""

    def __init__(self, pair, options: DecodeOptions, task: Task, gamma: int) -> None:
        if options.temperature != 0:
            raise ValueError("the device-side loop decodes at temperature 0 only")
        if gamma and pair.draft is None:
            raise ValueError("γ > 0 needs a draft")
        self.pair, self.task, self.gamma = pair, task, gamma
        V = pair.target.config.vocab_size
        self.always, self.at_begin = static_masks(task.filters, V, pair.device)  # [V] bool each
        if len(task.init) < 2:  # only timestamped English-only starts are shorter, refused above
            raise ValueError("the start sequence must hold at least two tokens")
        self.eot = pair.tokenizer.eot

    def _filtered(self, logits: Tensor, context: Tensor) -> Tensor:
        """logits [..., V] predicting the token after `context` [...] tokens -> filtered."""
        begin = (context == self.task.sample_begin)[..., None] & self.at_begin
        return logits.masked_fill(self.always | begin, float("-inf"))

    @torch.inference_mode()
    def start(
        self, target_states: Tensor, draft_states: Tensor | None
    ) -> tuple[Steps, LeanRunner, LeanRunner | None]:
        """Prefills both caches with the start sequence but its last token."""
        B, dev, init = target_states.shape[0], target_states.device, self.task.init
        target = make_runner(self.pair.target, target_states)
        draft = make_runner(self.pair.draft, draft_states, target) if self.gamma else None
        seq = torch.full((B, N_TEXT_CTX), self.eot, dtype=torch.long, device=dev)
        seq[:, : len(init)] = torch.tensor(init, device=dev)
        pos = torch.arange(len(init) - 1, device=dev).expand(B, -1)  # [B, P]
        logits = fixed_pass(target, seq[:, : len(init) - 1], pos)  # [B, P, V]
        if draft is not None:
            fixed_pass(draft, seq[:, : len(init) - 1], pos)
        sot = self.task.sot_index
        no_speech = torch.softmax(logits[:, sot].float(), -1)[:, self.pair.tokenizer.no_speech]
        zeros = torch.zeros(B, device=dev)
        lengths = torch.full((B,), len(init), dtype=torch.long, device=dev)
        steps = Steps(seq, lengths, torch.zeros(B, dtype=torch.bool, device=dev), zeros, no_speech)
        return steps, target, draft

    @torch.inference_mode()
    def step(self, s: Steps, target: LeanRunner, draft: LeanRunner | None) -> list[int]:
        """One speculative step for every row (done rows run and change nothing); returns the
        host read (accepted counts, -1 for done rows, then the done flags)."""
        g, L, last = self.gamma, s.lengths, N_TEXT_CTX - 1
        B, dev = L.shape[0], L.device
        ar = torch.arange(g + 1, device=dev)  # [γ+1]
        d = torch.empty(B, 0, dtype=torch.long, device=dev)  # [B, γ] drafts
        if g:
            pos = torch.stack([L - 2, L - 1], 1)  # [B, 2]
            logits = fixed_pass(draft, s.seq.gather(1, pos), pos)[:, -1]  # [B, V]
            drafts = [_argmax(self._filtered(logits, L))]
            for i in range(1, g):
                pos = (L + i - 1).clamp(max=last)[:, None]  # [B, 1]
                logits = fixed_pass(draft, drafts[-1][:, None], pos)[:, -1]
                drafts.append(_argmax(self._filtered(logits, L + i)))
            d = torch.stack(drafts, 1)
        pos = (L[:, None] - 1 + ar).clamp(max=last)  # [B, γ+1]
        tokens = torch.cat([s.seq.gather(1, (L - 1)[:, None]), d], 1)  # [B, γ+1]
        logits = self._filtered(fixed_pass(target, tokens, pos).float(), L[:, None] + ar)  # [B, γ+1, V]
        t = _argmax(logits)  # [B, γ+1]
        n = (d == t[:, :g]).long().cumprod(1).sum(1)  # [B] leading drafts the target agrees with
        if g:  # an accepted draft eot ends the row: it becomes the next token
            eot = d == self.eot
            n = torch.minimum(n, torch.where(eot.any(1), eot.long().argmax(1), g))
        n = torch.minimum(n, (self.task.limit - 1 - L).clamp(min=0))  # never past the limit
        nxt = t.gather(1, n[:, None])[:, 0]  # [B]
        new = torch.cat([d, nxt[:, None]], 1).scatter(1, n[:, None], nxt[:, None])  # [B, γ+1]
        live = ~s.done
        keep = live[:, None] & (ar <= n[:, None])  # [B, γ+1]: the tokens this step emits
        wpos = (L[:, None] + ar).clamp(max=last)
        s.seq.scatter_(1, wpos, torch.where(keep, new, s.seq.gather(1, wpos)))
        lp = torch.log_softmax(logits, -1).gather(-1, t[..., None])[..., 0]  # [B, γ+1]
        s.sum_logprob += (lp * keep).sum(1)
        s.lengths = L + (n + 1) * live
        s.done = s.done | (live & ((nxt == self.eot) | (s.lengths >= self.task.limit)))
        host = s.read(n, live)
        alive = [x >= 0 for x in host[:B]]
        s.passes += 1
        s.proposed += g * sum(alive)
        s.accepted += sum(x for x in host[:B] if x > 0)
        return host

    def run(self, target_states: Tensor, draft_states: Tensor | None = None) -> tuple[list[list[int]], Steps]:
        """Decodes every row to eot or the limit -> (sampled tokens per row, eot dropped; state)."""
        s, target, draft = self.start(target_states, draft_states)
        while True:
            host = self.step(s, target, draft)
            if all(host[len(host) // 2 :]):
                break
        begin, out = self.task.sample_begin, []
        for row, n in zip(s.seq.tolist(), s.lengths.tolist()):
            toks = row[begin:n]
            out.append(toks[:-1] if toks and toks[-1] == self.eot else toks)
        return out, s


@torch.inference_mode()
def decode_graphed(
    pair, target_states: Tensor, draft_states: Tensor | None, options: DecodeOptions, gamma: int
) -> tuple[list[list[int]], Steps]:
    """`decode.loop.decode_states` for the device-side loop: greedy tokens per row (the
    language detected when `options` names none), and the loop's state and counts."""
    task = Task.build(pair, options, task_language(pair, options, target_states), None)
    return GraphedGreedy(pair, options, task, gamma).run(target_states, draft_states)
