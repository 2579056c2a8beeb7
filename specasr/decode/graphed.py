"""Capture-safe greedy decoding: fixed shapes, state on the device, one host read per step.

The host loop (`decode.loop`, `decode.step`) keeps each row's context as a Python list,
reads every draft token back to the host, and feeds passes whose shapes follow the rows'
lengths. On a CPU that costs nothing. On a GPU every read is a synchronisation, and a pass
whose shapes change cannot be replayed from a CUDA graph. This module is the
same algorithm at T = 0 with all per-step state on the device:

- **Context:** `seq` [B, 448] and the lengths `L` [B].
- **Caches:** the runners' preallocated K/V [B, H, 448, dh] (`runtime.runner.LeanRunner`). Each
  pass writes a token's keys and values at its own position and attends over all 448
  positions behind a mask (key position ≤ query position). Entries past a row's length are
  stale and masked, then overwritten: rollback is free, and no shape depends on a length.
- **The draft** starts each step by feeding the last two context tokens (T = 2). So it never
  needs to know whether it saw the previous step's last draft token: rewriting a cached
  token's keys at the same position is harmless.
- **Filters** become two masks (`filters.static_masks`): suppressed always, and suppressed at
  the first sampled position. The timestamp rules, which branch on the context's tokens, run
  as tensor operations over the rows' contexts (`filters.timestamp_rules_on_device`): the
  draft's proposals are written into a copy of the context as they come, so each drafted
  position and each verified position sees its own context.
- **Prompts** (the text before, in sequential long-form) make start sequences of any length
  P: the prefill runs over a length bucket T ≥ P − 1 (4, 8, … 256), and where sampling
  begins, the token limit, the <|sot|> index and the draft's drop are tensors
  (`Workspace.meta`), so one loop, its step graphs and a prefill graph per bucket serve
  every prompt and language. The draft reads only the prompt's last
  `DecodeOptions.draft_prompt` tokens, as the host loop's `decode.runners.PromptTail`: its
  sequence skips prompt tokens 1 … drop, so its positions run `drop` behind the target's
  (the draft agrees far less after a long prompt; the target reads all of it).
- **Acceptance:** n = number of leading drafts equal to the target's argmax. The next token
  is the target's argmax at n. n is cut at a drafted <|endoftext|> (the target's token there
  is the same eot, so it becomes the next token), and so that no row passes its limit.

One host read per step: the rows' [accepted | done] flags, for stopping and statistics.

Every pass has fixed shapes for a given (B, γ): draft T = 2, draft T = 1, target T = the
loop's width W ≥ γ + 1 (γ = 0 is target-only decoding). With `DecodeOptions.device_width`
"matched" W is the same in every mode of those options (rows past γ + 1 are padding whose
keys and values land past the row's length, stale, as rejected drafts' do): a GPU product
rounds by its shape, and a row's result in a product of one shape does not depend on the other
rows, so each token's logits are the same bits in exact and autoregressive decoding and no
fp16 near-tie can flip between them. A step changes its state in place (`_advance`): no
tensor it reads or writes is rebound. So on CUDA the whole step (γ draft passes, the
target's pass, acceptance and the state update) is captured once as one CUDA graph, after
`WARM_STEPS` eager steps, and replayed: one launch and one host read per step. The graph,
the runners' caches and the state tensors form a workspace per batch size that later
decodes reuse (`start` refills it), so a graph is captured once per (B, γ), not per decode;
the start of a decode (cross K/V, start sequence, prefills) is a graph per prefill bucket.
What this needs of CUDA itself (side stream, capture, replay) is `specasr.backends.cuda.graphs`;
each pass runs the runner's layer steps (`specasr.runtime.forms`) over fixed shapes.
`decode.loop.decode_states` takes this loop on CUDA at T = 0 (`device_loop_plan`).
On a CPU the steps run eagerly; the tests check that their tokens are the host loop's,
that no step reads a value back other than through `Steps.read`, and that a step keeps
every tensor where it was.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from specasr.backends.cuda import graphs as cuda_graphs
from specasr.constants import N_TEXT_CTX
from specasr.decode.filters import TimestampRules, device_form, static_masks, timestamp_rules_on_device
from specasr.decode.gamma import AdaptiveGamma, GammaPolicy
from specasr.decode.runners import make_runner, prompt_drop
from specasr.decode.task import Task, task_language
from specasr.options import DecodeOptions
from specasr.runtime.runner import LeanRunner


def _argmax(x: Tensor) -> Tensor:
    """[..., V] -> [...]: the first maximal index, as the host loop's `first_argmax`, which on
    a CPU goes through numpy (a host tensor made per call: not capture-safe)."""
    return torch.argmax(x, dim=-1)


@torch.inference_mode()
def fixed_pass(
    runner: LeanRunner, tokens: Tensor, pos: Tensor, reduced: bool = False, hidden: bool = False
) -> Tensor:
    """tokens, pos [B, T] (each token's own position, < 448) -> logits [B, T, V] (reduced: a
    distilled draft's [B, T, N] over its columns `runner.columns`; hidden: [B, T, d], no
    head). Writes the tokens' keys and values at `pos`; query (b, i) attends keys at
    positions ≤ pos[b, i]. Shapes depend on B and T only; `runner.lengths` is neither read
    nor changed."""
    dec, K0 = runner.decoder, runner.k[0]
    (B, T), dev = tokens.shape, tokens.device
    mask = (torch.arange(N_TEXT_CTX, device=dev) <= pos[..., None])[:, None]  # [B, 1, T, 448]
    write = pos[:, None, :, None].expand(B, K0.shape[1], T, K0.shape[3])  # [B, H, T, dh]
    x = dec.embed(tokens, pos)  # [B, T, d]
    for step, K, V, (ck, cv) in zip(runner.steps, runner.k, runner.v, runner.cross):
        x = step(x, ck, cv, mask, (K, V), N_TEXT_CTX - T, write)
    if hidden:  # the last layer's output [B, T, d], before the final norm and the head
        return x
    return dec.reduced_logits(x) if reduced else dec.logits(x)


WARM_STEPS = 2  # eager steps before a CUDA graph is captured (lazy initialisations run first)


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
    replays: int = 0  # steps run as a CUDA graph replay
    history: list[list[int]] = field(default_factory=list)  # per step: accepted per row (-1: done)
    gammas: list[int] = field(default_factory=list)  # per step: its γ

    def read(self, flags: Tensor) -> list[int]:
        """The step's only device -> host read: flags [2B] = accepted counts (-1: done row),
        then the done flags."""
        host = flags.tolist()
        self.reads += 1
        self.history.append(host[: len(host) // 2])
        return host

    def reset(self) -> None:
        """The counts of a new decode in the same tensors (`GraphedGreedy._prefill` resets the
        tensors)."""
        self.reads = self.passes = self.proposed = self.accepted = self.replays = 0
        self.history, self.gammas = [], []


@dataclass
class Workspace:
    """What a captured step reads and writes, kept for the next decode of the same shape: the
    state, both runners (caches and cross K/V), and per γ the captured step with its output
    flags [2B] (one memory pool for all of them: they are replayed one at a time)."""

    steps: Steps
    target: LeanRunner
    draft: LeanRunner | None
    graphs: dict[int, tuple[object, Tensor]] = field(default_factory=dict)  # γ -> (CUDAGraph, flags)
    init: Tensor | None = None  # [448] long: this decode's start sequence, then eot
    meta: Tensor | None = None  # [4] long: this decode's P = len(start), token limit, <|sot|> index,
    # and the prompt tokens the draft skips (`GraphedGreedy.drop`)
    inputs: tuple[Tensor, Tensor | None] | None = None  # the start graphs' encoder states
    start_graphs: dict[int, object] = field(default_factory=dict)  # prefill length -> CUDAGraph

    def refill(self, target: LeanRunner, draft: LeanRunner | None) -> None:
        """Copies fresh runners' cross-attention K/V (new encoder states) into the kept ones."""
        pairs = [(self.target, target)] + ([(self.draft, draft)] if draft is not None else [])
        for kept, fresh in pairs:
            for (k0, v0), (k1, v1) in zip(kept.cross, fresh.cross):
                if k0 is k1:
                    continue
                k0.copy_(k1)
                v0.copy_(v1)


class GraphedGreedy:
    """Greedy decoding (γ > 0: speculative with the pair's draft; γ = 0: target only) with the
    passes `fixed_pass` runs. Tokens are the target's greedy tokens, as the host loop's.
    gamma: a fixed γ, or a `GammaPolicy` that picks each step's γ (1 … its gamma_max) from the
    accepted counts the step's one read brings back; every γ it may pick has its own graph.
    graphs: capture each step as a CUDA graph (None: on CUDA devices)."""

    def __init__(
        self,
        pair,
        options: DecodeOptions,
        task: Task,
        gamma: int | GammaPolicy,
        graphs: bool | None = None,
    ) -> None:
        if options.temperature != 0:
            raise ValueError("the device-side loop decodes at temperature 0 only")
        if (gamma if isinstance(gamma, int) else 1) and pair.draft is None:
            raise ValueError("γ > 0 needs a draft")
        self.policy = gamma if isinstance(gamma, GammaPolicy) else None
        if self.policy is not None and not hasattr(self.policy, "gamma_max"):
            raise ValueError(f"{type(gamma).__name__}: the device loop needs a policy with a gamma_max")
        self.gamma = gamma.gamma if self.policy is not None else gamma  # γ of the next step
        self.gammas = [gamma] if self.policy is None else list(range(1, self.policy.gamma_max + 1))
        natural = max(self.gammas) + 1
        self.width = natural if options.device_width == "natural" else max(matched_width(options), natural)
        self.pair, self.task = pair, task
        self.draft_prompt = options.draft_prompt  # prompt tokens the draft reads (None: all)
        V = pair.target.config.vocab_size
        rules = [f for f in task.filters if isinstance(f, TimestampRules)]
        self.rules = rules[0] if rules else None  # applied last, as in the host chain
        static = [f for f in task.filters if not isinstance(f, TimestampRules)]
        self.always, self.at_begin = static_masks(static, V, pair.device)  # [V] bool each
        self.eot = pair.tokenizer.eot
        self.start_gamma = self.gamma
        self.graphs = pair.device.type == "cuda" if graphs is None else graphs
        if self.graphs and pair.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.workspaces: dict[tuple, Workspace] = {}
        self.captures = 0  # graphs captured so far (one per workspace)
        self.capture_error: str | None = None  # why capture failed, if it did (then eager)
        self._side = cuda_graphs.SideStream()  # the CUDA stream of warm-ups and captures
        self._columns: Tensor | None = None  # a reduced-vocabulary draft's columns [N]
        self._reduced_masks: tuple[Tensor, Tensor] | None = None  # `always`, `at_begin` on them
        self._reduced_ts = 0  # how many of those columns are timestamps (the last ones)

    def _filtered(
        self, logits: Tensor, context: Tensor, tokens: Tensor | None, reduced: bool = False
    ) -> Tensor:
        """logits [..., V] predicting the token after the first `context` [...] tokens of
        `tokens` [..., 448] (the rows' contexts; None without timestamp rules) -> filtered.
        reduced: the columns are a draft's reduced ones (`_columns`)."""
        always, at_begin = self._reduced_masks if reduced else (self.always, self.at_begin)
        sample_begin = self._current.meta[0]  # this decode's P: a tensor, so prompts may vary
        begin = (context == sample_begin)[..., None] & at_begin
        logits = logits.masked_fill(always | begin, float("-inf"))
        if self.rules is None:
            return logits
        shape = logits.shape
        columns, n_ts = (self._columns, self._reduced_ts) if reduced else (None, None)
        out = timestamp_rules_on_device(
            self.rules,
            logits.reshape(-1, shape[-1]),
            tokens.reshape(-1, N_TEXT_CTX),
            context.reshape(-1),
            columns,
            n_ts,
            sample_begin,
        )
        return out.view(shape)

    def _draft_token(
        self, draft: LeanRunner, tokens: Tensor, pos: Tensor, context: Tensor, ctx: Tensor | None
    ) -> Tensor:
        """The draft's greedy token [B] after its pass over tokens, pos [B, T], the rows'
        contexts being the first `context` [B] tokens of ctx [B, 448]. A reduced-vocabulary
        draft picks among its own ascending columns: the same token as the full row, whose
        other columns are −inf, without building that row."""
        if self._columns is None:
            return _argmax(self._filtered(fixed_pass(draft, tokens, pos)[:, -1], context, ctx))
        logits = fixed_pass(draft, tokens, pos, reduced=True)[:, -1]  # [B, N]
        return self._columns[_argmax(self._filtered(logits, context, ctx, reduced=True))]

    def _runners(self, target_states: Tensor, draft_states: Tensor | None, kept: bool = False):
        """kept: runners with cross K/V of their own, neither read from nor held for others: a
        workspace's (`Workspace.refill` overwrites them) or a start graph's (`_prefill`)."""
        target = make_runner(self.pair.target, target_states, private=kept)
        draft = None
        if self.gammas != [0]:
            draft = make_runner(self.pair.draft, draft_states, target, private=kept)
        return target, draft

    def _prefill(
        self,
        ws: Workspace,
        target_states: Tensor,
        draft_states: Tensor | None,
        T: int,
        fresh=None,
        captured: bool = False,
    ) -> None:
        """The device work of `start`, in place (capturable): the cross K/V of these states
        into the kept runners, the start sequence (`ws.init`, `ws.meta`), and both caches
        prefilled over its first T ≥ P − 1 positions (T: a length bucket, so that one graph
        serves prompts of many lengths; keys past P − 2 are written again by the steps before
        any query reads them). fresh: runners already made on these states. captured: recorded
        into a start graph, whose runners must project the states in the graph: cross K/V held
        for the states' tensor (`decode.runners`) would be another graph's memory, which this
        graph's replays never recompute, so every prompt bucket but the first would decode a
        stale window's audio."""
        B, dev = target_states.shape[0], target_states.device
        ws.refill(*(fresh or self._runners(target_states, draft_states, kept=captured)))
        s = ws.steps
        s.seq.copy_(ws.init.expand(B, -1))
        s.lengths.copy_(ws.meta[0].expand(B))
        s.done.zero_()
        s.sum_logprob.zero_()
        pos = torch.arange(T, device=dev).expand(B, -1)  # [B, T]
        hidden = fixed_pass(ws.target, s.seq[:, :T], pos, hidden=True)  # [B, T, d]
        if ws.draft is not None:  # its sequence: <|startofprev|>, then the context past drop + 1
            j = pos[0]  # [T]
            src = (j + ws.meta[3] * (j > 0)).clamp(max=N_TEXT_CTX - 1)  # [T] context positions
            fixed_pass(ws.draft, s.seq.index_select(1, src), pos, hidden=True)
        logits = ws.target.decoder.logits(hidden.index_select(1, ws.meta[2:]))[:, 0]  # [B, V] after <|sot|>
        s.no_speech.copy_(torch.softmax(logits.float(), -1)[:, self.pair.tokenizer.no_speech])

    @torch.inference_mode()
    def start(
        self, target_states: Tensor, draft_states: Tensor | None, task: Task | None = None
    ) -> tuple[Steps, LeanRunner, LeanRunner | None]:
        """Prefills both caches with the start sequence of `task` (default: the loop's) but its
        last token. A workspace of the same shapes (an earlier decode's) is refilled and
        reused, its graphs with it; on CUDA its later decodes capture the prefill too (one
        graph per prefill length bucket), copy the states in and replay it."""
        task = task or self.task
        B, dev, init = target_states.shape[0], target_states.device, task.init
        P = len(init)
        if P < 2:
            raise ValueError("the start sequence must hold at least two tokens")
        T = min(N_TEXT_CTX - 1, max(4, 1 << (P - 2).bit_length()))  # a bucket ≥ P − 1
        key = (tuple(target_states.shape), None if draft_states is None else tuple(draft_states.shape))
        ws = self.workspaces.get(key)
        fresh = None
        if ws is None:
            fresh = self._runners(target_states, draft_states, kept=True)
            steps = Steps(
                torch.empty(B, N_TEXT_CTX, dtype=torch.long, device=dev),
                torch.zeros(B, dtype=torch.long, device=dev),
                torch.zeros(B, dtype=torch.bool, device=dev),
                torch.zeros(B, device=dev),
                torch.zeros(B, device=dev),
            )
            ws = self.workspaces[key] = Workspace(steps, *fresh)
            ws.init = torch.empty(N_TEXT_CTX, dtype=torch.long, device=dev)
            ws.meta = torch.empty(4, dtype=torch.long, device=dev)
        ws.init.copy_(torch.tensor(list(init) + [self.eot] * (N_TEXT_CTX - P)))
        ws.meta.copy_(torch.tensor([P, task.limit, task.sot_index, self.drop(task)]))
        self._current, self._task = ws, task
        if fresh is not None or not self.graphs:
            self._prefill(ws, target_states, draft_states, T, fresh)
        else:
            if ws.inputs is None:
                shared = draft_states is target_states or draft_states is None
                ws.inputs = (target_states.clone(), None if shared else draft_states.clone())
            t_in, d_in = ws.inputs
            t_in.copy_(target_states)
            if d_in is not None:
                d_in.copy_(draft_states)
            if T not in ws.start_graphs:
                d = t_in if d_in is None and draft_states is not None else d_in
                try:  # recorded, not run
                    graph, _ = cuda_graphs.capture(
                        lambda: self._prefill(ws, t_in, d, T, captured=True), self._side(dev)
                    )
                    ws.start_graphs[T] = graph
                except RuntimeError as e:  # as a step's capture: eager from here on
                    self.capture_error, self.graphs = str(e).splitlines()[0], False
                    ws.graphs.clear()
                    ws.start_graphs.clear()
                    cuda_graphs.settle(dev)
            if T in ws.start_graphs:
                ws.start_graphs[T].replay()
            else:
                self._prefill(ws, target_states, draft_states, T)
        ws.steps.reset()
        self.gamma = self.start_gamma
        if self.policy is not None:
            self.policy.gamma = self.start_gamma  # each decode starts where the first did
        if ws.draft is not None and self._columns is None and ws.draft.vocab is not None:
            self._columns = ws.draft.columns  # [N]: the draft's reduced columns (ascending tokens)
            self._reduced_masks = (self.always[self._columns], self.at_begin[self._columns])
            vocab = ws.draft.vocab
            self._reduced_ts = len(vocab) - bisect_left(vocab, self.pair.tokenizer.timestamp_begin)
        self._current = ws
        return ws.steps, ws.target, ws.draft

    def drop(self, task: Task) -> int:
        """Prompt tokens the draft skips (1 … drop after <|startofprev|>): all but the last
        `draft_prompt` (`decode.runners.prompt_drop`, as the host loop's draft)."""
        return prompt_drop(task.prompt_len, self.draft_prompt)

    def _advance(self, s: Steps, target: LeanRunner, draft: LeanRunner | None, g: int) -> Tensor:
        """One speculative step for every row (done rows run and change nothing), all on the
        device and in place: no tensor of `s` or of the runners is rebound, so the step can be
        replayed from a CUDA graph. -> flags [2B] long: accepted counts (-1: a done row), then
        the done flags."""
        L, last = s.lengths, N_TEXT_CTX - 1
        B, dev = L.shape[0], L.device
        span = torch.arange(self.width, device=dev)  # [W]: the target pass's positions past L − 2
        ar = span[: g + 1]  # [γ+1]
        d = torch.empty(B, 0, dtype=torch.long, device=dev)  # [B, γ] drafts
        ctx = s.seq.clone() if self.rules is not None else None  # [B, 448]: context + drafts so far
        if g:
            drop = self._current.meta[3]  # the draft's positions run this far behind (prompt tail)
            pos = torch.stack([L - 2, L - 1], 1)  # [B, 2]
            drafts = [self._draft_token(draft, s.seq.gather(1, pos), pos - drop, L, ctx)]
            for i in range(1, g):
                if ctx is not None:
                    ctx.scatter_(1, (L + i - 1).clamp(max=last)[:, None], drafts[-1][:, None])
                pos = (L + i - 1).clamp(max=last)[:, None]  # [B, 1]
                drafts.append(self._draft_token(draft, drafts[-1][:, None], pos - drop, L + i, ctx))
            d = torch.stack(drafts, 1)
            if ctx is not None:
                ctx.scatter_(1, (L + g - 1).clamp(max=last)[:, None], drafts[-1][:, None])
        W = self.width
        pos = (L[:, None] - 1 + span).clamp(max=last)  # [B, W]
        tokens = torch.cat([s.seq.gather(1, (L - 1)[:, None]), d], 1)  # [B, γ+1]
        if W > g + 1:  # padding to the loop's width: the last token again, its logits unread
            tokens = torch.cat([tokens, tokens[:, -1:].expand(B, W - g - 1)], 1)  # [B, W]
        rows = None if ctx is None else ctx[:, None].expand(B, g + 1, N_TEXT_CTX)  # each position's context
        out = fixed_pass(target, tokens, pos)[:, : g + 1]  # [B, γ+1, V]
        logits = self._filtered(out.float(), L[:, None] + ar, rows)  # [B, γ+1, V]
        t = _argmax(logits)  # [B, γ+1]
        n = (d == t[:, :g]).long().cumprod(1).sum(1)  # [B] leading drafts the target agrees with
        if g:  # an accepted draft eot ends the row: it becomes the next token
            eot = d == self.eot
            n = torch.minimum(n, torch.where(eot.any(1), eot.long().argmax(1), g))
        limit = self._current.meta[1]
        n = torch.minimum(n, (limit - 1 - L).clamp(min=0))  # never past the limit
        nxt = t.gather(1, n[:, None])[:, 0]  # [B]
        new = torch.cat([d, nxt[:, None]], 1).scatter(1, n[:, None], nxt[:, None])  # [B, γ+1]
        live = ~s.done
        keep = live[:, None] & (ar <= n[:, None])  # [B, γ+1]: the tokens this step emits
        wpos = (L[:, None] + ar).clamp(max=last)
        s.seq.scatter_(1, wpos, torch.where(keep, new, s.seq.gather(1, wpos)))
        lp = torch.log_softmax(logits, -1).gather(-1, t[..., None])[..., 0]  # [B, γ+1]
        s.sum_logprob.add_((lp * keep).sum(1))
        lengths = L + (n + 1) * live
        ended = live & ((nxt == self.eot) | (lengths >= limit))
        s.lengths.copy_(lengths)
        s.done.logical_or_(ended)
        return torch.cat([torch.where(live, n, -1), s.done.long()])

    def _device_step(self, s: Steps, target: LeanRunner, draft: LeanRunner | None, g: int) -> Tensor:
        """The step's device work at γ = g: eager, or (CUDA, after `WARM_STEPS` eager steps of
        the workspace's first decode) a graph replay. The first capture records a graph for
        every γ the loop may pick: capturing runs nothing, so the state is left as it was."""
        ws = getattr(self, "_current", None)
        if not self.graphs or ws is None or ws.steps is not s:
            return self._advance(s, target, draft, g)
        if not ws.graphs:
            dev = s.seq.device
            side = self._side(dev)
            if s.passes < WARM_STEPS:
                return cuda_graphs.warm(lambda: self._advance(s, target, draft, g), dev, side)
            try:
                pool = None
                for k in self.gammas:  # recorded, not run
                    graph, flags = cuda_graphs.capture(
                        lambda k=k: self._advance(s, target, draft, k), side, pool
                    )
                    pool = graph.pool()
                    ws.graphs[k] = (graph, flags)
                    self.captures += 1
            except RuntimeError as e:  # a failed capture leaves the state untouched: go eager
                self.capture_error, self.graphs = str(e).splitlines()[0], False
                ws.graphs.clear()
                cuda_graphs.settle(dev)
                return self._advance(s, target, draft, g)
        graph, flags = ws.graphs[g]
        graph.replay()
        s.replays += 1
        return flags

    @torch.inference_mode()
    def step(self, s: Steps, target: LeanRunner, draft: LeanRunner | None) -> list[int]:
        """One speculative step for every row (done rows run and change nothing); returns the
        host read (accepted counts, -1 for done rows, then the done flags). A γ policy hears
        the fewest accepted over the live rows and picks the next step's γ."""
        g = self.gamma
        host = s.read(self._device_step(s, target, draft, g))
        B = len(host) // 2
        live = [x for x in host[:B] if x >= 0]
        s.passes += 1
        s.gammas.append(g)
        s.proposed += g * len(live)
        s.accepted += sum(live)
        if self.policy is not None and live:
            self.policy.update(g, min(live), per_row=live)
            self.gamma = min(max(self.policy.next(len(live)), 1), self.gammas[-1])
        return host

    def run(
        self, target_states: Tensor, draft_states: Tensor | None = None, task: Task | None = None
    ) -> tuple[list[list[int]], Steps]:
        """Decodes every row to eot or the limit -> (sampled tokens per row, eot dropped; state).
        task: this decode's (its prompt and language; default: the loop's)."""
        s, target, draft = self.start(target_states, draft_states, task)
        while True:
            host = self.step(s, target, draft)
            if all(host[len(host) // 2 :]):
                break
        begin, out = self._task.sample_begin, []
        for n, *row in torch.cat([s.lengths[:, None], s.seq], 1).tolist():  # one read
            toks = row[begin:n]
            out.append(toks[:-1] if toks and toks[-1] == self.eot else toks)
        return out, s


# γ policy "auto" in the device loop, from base + its draft on a GPU (docs/benchmarks.md):
DEVICE_GAMMA = 5  # text-only decodes: the best fixed γ at B = 1 (the clips, decoder phase)
# timestamped decodes (`transcribe`'s default, long-form): timestamps are drafted worse, and
# γ 2 was the best fixed γ end to end, sequential, chunked and per clip
DEVICE_GAMMA_TIMESTAMPS = 2


def device_loop_plan(pair, options: DecodeOptions, task: Task, hooks) -> int | GammaPolicy | None:
    """The γ (0: target only) or γ policy the device loop decodes this task with, or None where
    the host loop must: not CUDA, T > 0, beam search, hooks, phase timing, a start sequence of
    one token (timestamped English-only), a forced prefix, or `options.device_loop` off. A
    prompt is fine: the draft reads its last `draft_prompt` tokens, as the host loop's does.
    "auto" is fixed at `DEVICE_GAMMA`, or `DEVICE_GAMMA_TIMESTAMPS` with timestamps (at most `options.gamma`),
    "adaptive" adapts from γ up to min(γ_max, 8); "fixed", "backoff" and "analytic" (whose
    costs are a CPU's, or need phase times) are fixed at γ."""
    if not options.device_loop or pair.device.type != "cuda" or options.temperature != 0:
        return None
    if options.beam_size > 1:
        return None
    if options.timing or (hooks is not None and (hooks.on_pass or hooks.stop)):
        return None
    if not device_form(task.filters) or len(task.init) < 2 or task.forced:
        return None
    return _drafting(options) if options.speculative else 0


def _drafting(options: DecodeOptions) -> int | GammaPolicy:
    """The γ or γ policy the device loop drafts with under these options' speculative modes."""
    if options.gamma_policy == "auto":
        return min(options.gamma, DEVICE_GAMMA_TIMESTAMPS if options.timestamps else DEVICE_GAMMA)
    if options.gamma_policy == "adaptive":
        return AdaptiveGamma(options.gamma, max(options.gamma, min(options.gamma_max, 8)))
    return options.gamma


def matched_width(options: DecodeOptions) -> int:
    """1 + the largest γ these options' speculative modes draft in the device loop: its target
    passes' width in every mode, target-only too (`DecodeOptions.device_width` "matched")."""
    plan = _drafting(options)
    return 1 + (plan if isinstance(plan, int) else plan.gamma_max)


def device_results(
    pair, target_states: Tensor, draft_states: Tensor | None, options: DecodeOptions, task: Task, plan, stats
) -> list:
    """`decode.loop.decode_states`' results from the device loop: the same tokens, text,
    average log-probability and no-speech probability, the token kinds, and the speculative
    counts in `stats`."""
    from specasr.results import DecodeResult

    graphs = None if pair.device.type == "cuda" else False
    rows, s = _kept_loop(pair, options, task, plan, graphs).run(target_states, draft_states, task)
    B = len(rows)
    kinds: list[list[str]] = [[] for _ in range(B)]
    for g, accepted in zip(s.gammas, s.history):  # one step: its γ, each row's accepted count
        live = [n for n in accepted if n >= 0]
        stats.target_calls += 1
        stats.gammas.append(g)
        stats.draft_calls += g
        if g:
            stats.proposed += g * len(live)
            stats.accepted += sum(live)
            stats.rejected += sum(n < g for n in live)
            stats.row_steps += len(live)
            stats.accepted_hist.update(live)
        stats.emitted += sum(n + 1 for n in live)
        for r, n in enumerate(accepted):
            if n >= 0:
                kinds[r] += ["target"] if not g else ["draft"] * n + ["bonus" if n == g else "corrected"]
    tok, out = pair.tokenizer, []
    read = torch.cat([s.sum_logprob, s.no_speech]).tolist()  # one read
    sums, no_speech = read[:B], read[B:]
    for r, toks in enumerate(rows):
        out.append(
            DecodeResult(
                tokens=toks,
                text=tok.decode(toks),
                avg_logprob=sums[r] / (len(toks) + 1),
                no_speech_prob=no_speech[r],
                temperature=options.temperature,
                language=task.language,
                stats=stats,
                token_kinds=kinds[r][: len(toks)],
            )
        )
    return out


def _kept_loop(pair, options: DecodeOptions, task: Task, gamma, graphs) -> GraphedGreedy:
    """The loop for this pair, task and γ, kept (with its graphs) for the next such decode.
    The key leaves out the task (its start sequence is data) and the seed: long-form decodes
    window k with seed + k, which a loop at temperature 0 never reads, so every window of a
    recording shares one loop and its graphs. The least recently used of `KEPT_LOOPS` goes."""
    key = (id(pair), replace(options, seed=0), repr(gamma), graphs)
    kept = _LOOPS.pop(key, None)
    if kept is None or kept[0] is not pair:
        while len(_LOOPS) >= KEPT_LOOPS:
            del _LOOPS[next(iter(_LOOPS))]
        kept = (pair, GraphedGreedy(pair, options, task, gamma, graphs))
    _LOOPS[key] = kept  # last: the most recently used
    return kept[1]


KEPT_LOOPS = 8
_LOOPS: dict[tuple, tuple[object, GraphedGreedy]] = {}  # decode_graphed's loops, oldest use first


@torch.inference_mode()
def decode_graphed(
    pair,
    target_states: Tensor,
    draft_states: Tensor | None,
    options: DecodeOptions,
    gamma: int | GammaPolicy,
    graphs: bool | None = None,
    prompt: list[int] | None = None,
) -> tuple[list[list[int]], Steps]:
    """`decode.loop.decode_states` for the device-side loop: greedy tokens per row (the
    language detected when `options` names none), and the loop's state and counts. The loop
    (and so its captured graphs) is kept for the next call with the same pair, options and γ
    (a policy: the same policy as constructed, i.e. its repr when it is handed in), whatever
    the prompt or language. prompt: tokens of the text before, as `decode_states` takes them."""
    task = Task.build(pair, options, task_language(pair, options, target_states), prompt)
    return _kept_loop(pair, options, task, gamma, graphs).run(target_states, draft_states, task)
