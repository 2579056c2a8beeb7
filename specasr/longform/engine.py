"""Where a transcription's model work runs: encoding windows, decoding them, and the model's
other passes (language detection, word alignment).

- `LocalEngine` runs it in the calling thread; `transcribe` uses one unless given another.
- `SharedEngine` runs the model work of many transcriptions, each consumed in a thread of its
  own (a server's requests), in one engine thread. Decode passes that can share a batch are
  decoded as rows of one batch: greedy passes (temperature 0) with equal options, prompt and
  language, from whichever transcriptions have one waiting. Rows are ragged (decode/loop.py):
  each keeps its own acceptances and ends on its own, so a row's tokens are those it would get
  alone. Sampled passes (the temperature fallback) are decoded alone, with their window's own
  seed, as a `LocalEngine` would decode them, and so is every encoder pass: a request's windows
  are encoded exactly as `specasr transcribe` encodes them, so at temperature 0 a request's
  transcript is the one the CLI gives for the same file and options.

The engine waits for work from every registered transcription (`client()`) for at most
`gather_s` before it runs what it has. Language detection and a transcription's one other model
pass, word alignment (`run()`), run in the engine thread too: it is the one thread of the
process whose torch work runs on every core (`process.one_openmp_team`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

import torch
from torch import Tensor

from specasr.decode.loop import decode_states
from specasr.decode.runners import join_cross
from specasr.decode.task import language_probs
from specasr.options import DecodeOptions
from specasr.results import DecodeResult
from specasr.stats import DecodeStats, timed

T = TypeVar("T")


class Engine(Protocol):
    """What the long-form strategies ask of the models."""

    pair: Any

    def encode(self, windows: Tensor, stats: DecodeStats) -> tuple[Tensor, Tensor | None]:
        """windows [B, n_mels, 3000] -> (target states [B, 1500, d], draft states or None)."""

    def decode(
        self,
        target_states: Tensor,
        draft_states: Tensor | None,
        options: DecodeOptions,
        prompt: list[int] | None,
        stats: DecodeStats,
    ) -> list[DecodeResult]:
        """One decode pass of B windows from their encoder states (`decode_states`)."""

    def detect(self, target_states: Tensor) -> list[dict[str, float]]:
        """Each window's language probabilities (`decode.task.language_probs`) from its target
        encoder states [B, 1500, d]."""

    def run(self, work: Callable[[], T]) -> T:
        """`work()`, any other model pass of a transcription (word alignment), run where the
        engine runs its model work."""


class LocalEngine:
    """The model work done in the calling thread."""

    def __init__(self, pair) -> None:
        self.pair = pair

    def encode(self, windows: Tensor, stats: DecodeStats) -> tuple[Tensor, Tensor | None]:
        with timed(stats, "encoder_s", self.pair.device):
            return self.pair.encode(windows)

    def decode(self, target_states, draft_states, options, prompt, stats) -> list[DecodeResult]:
        return decode_states(self.pair, target_states, draft_states, options, prompt, stats)

    def detect(self, target_states: Tensor) -> list[dict[str, float]]:
        return language_probs(self.pair, target_states)

    def run(self, work: Callable[[], T]) -> T:
        return work()


@dataclass
class _Job:
    """One piece of model work waiting for the engine thread."""

    run: Callable[[], Any] | None  # work that runs alone; None for a decode that may share a batch
    key: tuple | None = None  # decodes with equal keys share a batch
    states: tuple[Tensor, Tensor | None] | None = None  # a shareable decode's (target, draft) states
    options: DecodeOptions | None = None
    prompt: list[int] | None = None
    stats: DecodeStats | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    @property
    def rows(self) -> int:
        return 0 if self.states is None else self.states[0].shape[0]


class EngineClosed(RuntimeError):
    pass


class SharedEngine:
    """One engine thread doing the model work of many transcriptions (see the module doc).

    max_rows: rows a shared decode batch takes at most; gather_s: how long the engine waits for
    the registered transcriptions' next pieces of work before it runs what it has.
    """

    def __init__(self, pair, max_rows: int = 16, gather_s: float = 0.01) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        if not gather_s >= 0:
            raise ValueError(f"gather_s must be >= 0, got {gather_s}")
        self.pair, self.max_rows, self.gather_s = pair, max_rows, gather_s
        self.local = LocalEngine(pair)
        self._cv = threading.Condition()
        self._jobs: list[_Job] = []
        self._clients = 0
        self._closed = False
        self._model = threading.RLock()  # held by the engine thread while it runs a batch
        self.batches: list[int] = []  # rows of each shared decode batch run, in order (for tests and logs)
        self._thread = threading.Thread(target=self._serve, name="specasr-engine", daemon=True)
        self._thread.start()

    # ---- the callers' side -------------------------------------------------------------
    @contextlib.contextmanager
    def client(self) -> Iterator[None]:
        """Registers one transcription for the time it runs: the engine waits (at most
        `gather_s`) for every registered transcription's next piece of work."""
        with self._cv:
            self._clients += 1
        try:
            yield
        finally:
            with self._cv:
                self._clients -= 1
                self._cv.notify_all()

    def encode(self, windows: Tensor, stats: DecodeStats) -> tuple[Tensor, Tensor | None]:
        return self._submit(_Job(run=lambda: self.local.encode(windows, stats)))

    def detect(self, target_states: Tensor) -> list[dict[str, float]]:
        # a job of its own, like an encode: a transcription's decode follows its detection
        # within one round of the engine, so the decodes of transcriptions that arrived
        # together are ready together and share a batch
        return self._submit(_Job(run=lambda: self.local.detect(target_states)))

    def decode(self, target_states, draft_states, options, prompt, stats) -> list[DecodeResult]:
        if options.temperature > 0:  # a sample draws from the generator: alone, with its own seed
            return self._submit(
                _Job(run=lambda: self.local.decode(target_states, draft_states, options, prompt, stats))
            )
        shared = draft_states is not None and draft_states is target_states
        key = (replace(options, seed=0), tuple(prompt or ()), draft_states is None, shared)
        job = _Job(run=None, key=key, states=(target_states, draft_states), options=options, prompt=prompt)
        job.stats = stats
        return self._submit(job)

    def run(self, work: Callable[[], T]) -> T:
        return self._submit(_Job(run=work))

    def exclusive(self) -> contextlib.AbstractContextManager:
        """Held, the engine thread starts no model work (it finishes the batch it runs first):
        for a caller that must see none run, e.g. a test holding the engine busy."""
        return self._model

    def close(self) -> None:
        """Finishes the work already submitted, then stops the engine thread."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join()

    def _submit(self, job: _Job):
        with self._cv:
            if self._closed:
                raise EngineClosed("the engine is shutting down")
            self._jobs.append(job)
            self._cv.notify_all()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    # ---- the engine thread ---------------------------------------------------------------
    def _take(self) -> list[_Job]:
        with self._cv:
            while not self._jobs and not self._closed:
                self._cv.wait()
            deadline = time.monotonic() + self.gather_s
            while len(self._jobs) < self._clients and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            jobs, self._jobs = self._jobs, []
            return jobs

    def _serve(self) -> None:
        while True:
            jobs = self._take()
            if not jobs:  # closed, and nothing left
                return
            with self._model, torch.inference_mode():
                for job in jobs:
                    if job.run is not None:
                        self._finish([job], job.run)
                groups: dict[tuple, list[_Job]] = {}
                for job in jobs:
                    if job.run is None:
                        groups.setdefault(job.key, []).append(job)
                for group in groups.values():
                    for batch in self._batches(group):
                        self._finish(batch, lambda batch=batch: self._decode_together(batch))

    def _batches(self, group: list[_Job]) -> Iterator[list[_Job]]:
        """The group's jobs in arrival order, in batches of at most max_rows rows (a job
        with more rows than that runs alone)."""
        batch, rows = [], 0
        for job in group:
            if batch and rows + job.rows > self.max_rows:
                yield batch
                batch, rows = [], 0
            batch.append(job)
            rows += job.rows
        if batch:
            yield batch

    def _decode_together(self, jobs: list[_Job]) -> list[list[DecodeResult]]:
        first = jobs[0]
        if len(jobs) == 1:
            return [self.local.decode(*first.states, first.options, first.prompt, first.stats)]
        parts = [j.states[0] for j in jobs]
        target = torch.cat(parts)  # [sum of rows, 1500, d_target]
        join_cross(self.pair.target, parts, target)  # projected by their detection
        no_draft, shared = first.key[2], first.key[3]
        draft = None if no_draft else target if shared else torch.cat([j.states[1] for j in jobs])
        stats = DecodeStats()
        results = self.local.decode(target, draft, first.options, first.prompt, stats)
        self.batches.append(len(results))
        out, at = [], 0
        for job in jobs:
            out.append(results[at : at + job.rows])
            at += job.rows
            _absorb(job.stats, stats)  # a request's statistics count the batches its windows shared
        return out

    def _finish(self, jobs: list[_Job], work: Callable[[], Any]) -> None:
        try:
            results = work()
            if jobs[0].run is None:  # a decode batch: one list of rows per job
                for job, rows in zip(jobs, results):
                    job.result = rows
            else:
                jobs[0].result = results
        except BaseException as e:  # noqa: BLE001 (the caller gets it, whatever it is)
            for job in jobs:
                job.error = e
        for job in jobs:
            job.done.set()


def _absorb(into: DecodeStats, other: DecodeStats) -> None:
    """Adds `other` into `into` in place (the caller holds `into`)."""
    merged = into.merge(other)
    for name, value in vars(merged).items():
        setattr(into, name, value)
