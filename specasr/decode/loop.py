"""Decoding one batch of 30 s windows: target only (autoregressive) or speculative.

`decode_states` builds the task (start sequence, filters, token limit), then `DecodeLoop`
runs steps until every row has ended: a target-only step when there is no draft, else a
speculative step (`step.py`: propose, score, verify, commit). The γ policy
(`gamma.py`) picks each step's γ; the stop policy (`stop.py`) may end a draft run early.
Rows are ragged: each keeps every token it accepted, so rows advance at their own pace
and end at different steps. The token limit cuts each row's tokens, not γ, so a row takes
the same passes in a batch as alone (γ is capped only by the cache's 448 positions).
Finished rows (end of text or token limit) are dropped from both caches, so they stop
consuming work.

Timing is opt-in (`DecodeOptions.timing`): off, the loop reads no clock for its phases and,
on CUDA, adds no synchronisation; on, phases are timed with wall time on a CPU and CUDA
events on a GPU (`stats.Clock`). The `analytic` γ policy needs the times, so it turns them on.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specasr.backends import process
from specasr.backends.cpu import heap
from specasr.constants import N_TEXT_CTX, int8_decoder
from specasr.decode.beam import BeamSearch, Window, best_of
from specasr.decode.calibration import measured_costs
from specasr.decode.gamma import backs_off, make_policy, stored_cost
from specasr.decode.graphed import device_loop_plan, device_results
from specasr.decode.race import KeyedRace
from specasr.decode.runners import make_runner, prompt_tail
from specasr.decode.step import Batch, Hooks, SpeculativeStep, StepContext, target_step
from specasr.decode.stop import make_stop
from specasr.decode.task import Task, task_language
from specasr.options import DecodeOptions
from specasr.results import DecodeResult
from specasr.runtime.runner import decoder_form
from specasr.stats import Clock, DecodeStats, timed


class DecodeLoop:
    """Runs one batched decode to the end and returns its rows."""

    def __init__(
        self, pair, options: DecodeOptions, task: Task, stats: DecodeStats, hooks: Hooks, rows: int = 1
    ) -> None:
        """rows: the batch's rows at the start (its cost curves are those of up to that many)."""
        self.pair, self.options, self.task, self.stats, self.hooks = pair, options, task, stats, hooks
        langs = getattr(pair, "draft_languages", None)  # what a distilled draft was trained on
        untrained = langs is not None and options.language is not None and options.language not in langs
        measured = None  # this machine's cost curves (`calibration`), else the stored ones decide
        if options.speculative and backs_off(options.gamma_policy, pair.device.type):
            measured = measured_costs(pair, rows)
        self.policy = make_policy(
            options.gamma_policy,
            options.gamma,
            options.gamma_max,
            pair.device.type,
            measured.single if measured else stored_cost(pair),  # else a draft's stored curve
            untrained,
            int8_decoder(getattr(pair, "compute_type", "float32")),  # its stored batch curves
            measured.batch if measured else None,
        )
        clock = Clock(stats, pair.device, options.timing or self.policy.wants_times)
        gen = torch.Generator(device=pair.device).manual_seed(options.seed)
        race = None
        if options.temperature > 0 and options.coupled:
            race = KeyedRace(options.seed, pair.vocab_size, pair.device)
        self.ctx = StepContext(pair, options, task, stats, clock, gen, race)

    def _runners(self, target_states: Tensor, draft_states: Tensor | None):
        """The target's runner and the speculative step (None: target only)."""
        ctx, pair, task = self.ctx, self.pair, self.task
        with ctx.clock.phase("window_s"):
            target = make_runner(pair.target, target_states)
            if draft_states is None:
                return target, None
            draft = make_runner(pair.draft, draft_states, target)
            draft = prompt_tail(draft, task.prompt_len, self.options.draft_prompt)
        stop = self.hooks.stop or make_stop(self.options.draft_stop, self.options.temperature)
        return target, SpeculativeStep(ctx, target, draft, stop)

    def search(self, target_states: Tensor, draft_states: Tensor | None) -> list[Window]:
        """Beam search (T = 0, beam_size > 1) over the rows: one `Window` per row, finished."""
        target, step = self._runners(target_states, draft_states)
        windows = BeamSearch(self.ctx, target, step, self.policy).run(target_states.shape[0])
        self.ctx.clock.flush()
        return windows

    def run(self, target_states: Tensor, draft_states: Tensor | None) -> Batch:
        """target_states [B, 1500, d_target]; draft_states [B, 1500, d_draft], or None for
        target-only decoding -> the finished batch."""
        ctx, pair, task = self.ctx, self.pair, self.task
        batch = Batch.start(task.init, target_states.shape[0])
        target, step = self._runners(target_states, draft_states)
        runners = [target] + ([step.draft] if step is not None else [])
        while batch.active:
            rows = len(batch.active)
            gamma = 0 if step is None else min(self.policy.next(rows), N_TEXT_CTX - max(batch.lengths))
            if gamma == 0:  # no draft, or the γ policy backed off: target only (the draft catches up later)
                target_step(ctx, batch, target)
            else:  # (the room left in the cache for the longest row's γ is >= 1)
                self._speculative(step, batch, gamma)
            if ctx.race is not None:  # positions decoded for good need no noise any more
                for r in batch.active:
                    ctx.race.forget(r, len(batch.seqs[r]))
            before = len(batch.active)
            kept = batch.finish(pair.tokenizer.eot, task.limit)
            if kept and len(kept) < before:
                for runner in runners:
                    runner.keep(kept)
        ctx.clock.flush()
        return batch

    def _speculative(self, step: SpeculativeStep, batch: Batch, gamma: int) -> None:
        stats, policy = self.stats, self.policy
        if policy.wants_times:
            self.ctx.clock.flush()
        draft_before, target_before = stats.draft_s, stats.target_s
        done = step(batch, gamma)
        if policy.wants_times:
            self.ctx.clock.flush()
        used = done.proposal.gamma
        policy.update(
            used,
            min(done.accepted),  # γ is the batch's: the rows that accepted least speak for it
            stats.draft_s - draft_before,
            stats.target_s - target_before,
            stopped=done.proposal.stopped,
            per_row=done.accepted,
        )
        if self.hooks.on_pass is not None:
            self.hooks.on_pass(done)


@torch.inference_mode()
def decode(
    pair, mel: Tensor, options: DecodeOptions, prompt: list[int] | None = None, hooks: Hooks | None = None
) -> list[DecodeResult]:
    """mel: Tensor, shape = (B, n_mels, 3000) -> one DecodeResult per row."""
    stats = DecodeStats()
    with heap.workspace():  # the encoder's and the loop's temporaries stay in the heap until done
        with timed(stats, "encoder_s", pair.device):
            target_states, draft_states = pair.encode(mel)
        return decode_states(pair, target_states, draft_states, options, prompt, stats, hooks)


INT8_SPECULATIVE = (
    "this int8 target decodes autoregressively only: speculative decoding needs attention whose "
    "every row is bitwise alike in a k-token verify pass and a one-token step (int8 quantisation "
    "turns last-bit differences into different tokens), and this machine's BLAS gave none "
    "(`specasr.backends.cpu.invariant.fixed_rows` is 0); use mode 'autoregressive' with compute type int8, "
    "or compute type float32 for speculative modes"
)


def speculates_exactly(pair) -> bool:
    """Whether speculative modes keep the target's greedy tokens with this pair: always in
    fp32 (up to summation order), and for an int8 target when its layer form attends
    row-invariantly (`specasr.runtime.forms`, `specasr.backends.cpu.invariant`)."""
    if not int8_decoder(getattr(pair, "compute_type", "float32")):
        return True
    return decoder_form(pair.target).fixed_rows > 0


@torch.inference_mode()
def decode_states(
    pair,
    target_states: Tensor,
    draft_states: Tensor | None,
    options: DecodeOptions,
    prompt: list[int] | None = None,
    stats: DecodeStats | None = None,
    hooks: Hooks | None = None,
) -> list[DecodeResult]:
    """Decodes from encoder outputs (reused across temperature fallbacks).

    target_states: (B, 1500, d_target); draft_states: (B, 1500, d_draft) or None.
    """
    stats = stats or DecodeStats()
    if options.speculative and (pair.draft is None or draft_states is None):
        raise ValueError(f"mode {options.mode!r} needs a draft model; load one or use mode 'autoregressive'")
    if options.speculative and not speculates_exactly(pair):
        raise ValueError(INT8_SPECULATIVE)
    language = task_language(pair, options, target_states)
    task = Task.build(pair, options, language, prompt)
    plan = device_loop_plan(pair, options, task, hooks)
    if plan is not None:  # CUDA, greedy: one graph per step
        with timed(stats, "decoder_s", pair.device):
            return device_results(pair, target_states, draft_states, options, task, plan, stats)
    rows = target_states.shape[0] * options.candidates  # beams, best-of: rows each
    loop = DecodeLoop(pair, options, task, stats, hooks or Hooks(), rows)
    drafts = draft_states if options.speculative else None
    if options.temperature == 0 and options.beam_size > 1:
        speculate = options.speculative_beams
        if speculate is None:
            speculate = pair.device.type != "cpu"
        with timed(stats, "decoder_s", pair.device):
            windows = loop.search(target_states, drafts if speculate else None)
        begin = len(task.init)  # lengths and log-probs count the sampled tokens
        best = [w.best(begin, options.length_penalty) for w in windows]
        rows = [
            (seq, lp, w.no_speech, ["target"] * (len(seq) - begin)) for (seq, lp), w in zip(best, windows)
        ]
        return [_result(pair, task, options, language, stats, *row) for row in rows]
    n = options.candidates  # best-of: every window sampled n times, as rows of the batch
    if n > 1:
        target_states = target_states.repeat_interleave(n, dim=0)
        drafts = None if drafts is None else drafts.repeat_interleave(n, dim=0)
    with timed(stats, "decoder_s", pair.device), process.decoding_threads(len(target_states)):
        batch = loop.run(target_states, drafts)
    chosen = list(range(len(target_states)))
    if n > 1:
        eot = pair.tokenizer.eot
        lengths = [len(s) - len(task.init) - (s[-1] == eot) for s in batch.seqs]
        chosen = best_of(batch.sum_logprob, lengths, n, options.length_penalty)
    return [
        _result(
            pair,
            task,
            options,
            language,
            stats,
            batch.seqs[r],
            batch.sum_logprob[r],
            batch.no_speech[r],
            batch.kinds[r],
        )
        for r in chosen
    ]


def _result(pair, task: Task, options: DecodeOptions, language, stats, seq, sum_logprob, no_speech, kinds):
    """One row's DecodeResult: its context `seq`, the sum of its sampled tokens' log-probs
    (<|endoftext|>'s included), P(<|nospeech|>) and the kind of each sampled token."""
    tok = pair.tokenizer
    toks = seq[task.sample_begin :]  # the forced prefix, then the sampled tokens
    text_toks = toks[:-1] if toks and toks[-1] == tok.eot else toks
    return DecodeResult(
        tokens=text_toks,
        text=tok.decode(text_toks),
        avg_logprob=sum_logprob / (len(text_toks) - task.forced + 1),
        no_speech_prob=no_speech,
        temperature=options.temperature,
        language=language,
        stats=stats,
        token_kinds=(["prefix"] * task.forced + kinds)[: len(text_toks)],
    )
