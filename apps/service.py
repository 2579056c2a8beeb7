"""What the app does with a request, with no Gradio in it: limits, options, runs, comparisons.

The Gradio layer (gradio_app.py) turns its widgets' values into `Controls`, calls `load_input`
and then `run` or `compare`, and shows what they return. Decoding itself is the library's
`transcribe`; nothing here decodes.
"""

from __future__ import annotations

import difflib
import os
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from specasr.audio import AudioError, load_audio
from specasr.constants import SAMPLE_RATE
from specasr.options import TranscribeOptions, fallback_schedule

if TYPE_CHECKING:  # types only: `specasr app --help` does not load torch
    import numpy as np

    from specasr.results import Segment, TranscriptionInfo

MIB = 2**20
_TRANSCRIBE = TranscribeOptions()
_DECODE = _TRANSCRIBE.decode


def _ratio(value: float, proposed: int) -> str:
    return f"{value:.3f}" if proposed else "n/a"


@dataclass(frozen=True)
class AppOptions:
    max_seconds: float = 600.0  # longest audio accepted, in seconds
    max_upload_mb: float = 50.0  # largest upload accepted, in MiB (Gradio refuses larger ones itself)
    concurrency_limit: int = 1  # requests decoded at once; they share one pair of models
    max_queue: int = 16  # requests allowed to wait beyond those; more are turned away

    def __post_init__(self) -> None:
        for name in ("max_seconds", "max_upload_mb", "concurrency_limit", "max_queue"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Controls:
    """The app's toggles; gradio_app.py builds one widget per field, in this order."""

    mode: str = _DECODE.mode  # autoregressive | baseline | exact | sigmoid
    gamma_policy: str = _DECODE.gamma_policy  # auto | fixed | adaptive | analytic
    gamma: int = _DECODE.gamma  # draft tokens per step: the fixed value, or the start
    draft_stop: float = _DECODE.draft_stop  # end a draft run at a proposal with q(d) below (0 = off)
    temperature: float = _DECODE.temperature  # the first temperature; fallbacks step up by 0.2
    sigmoid_alpha: float = _DECODE.sigmoid_scale[0]  # α of the sigmoid verifier
    sigmoid_beta: float = _DECODE.sigmoid_scale[1]  # β of the sigmoid verifier
    language: str = _DECODE.language or "auto"  # a language code, or "auto" to detect it
    task: str = _DECODE.task  # transcribe | translate
    timestamps: bool = _DECODE.timestamps  # decode timestamp tokens and show segment times
    seed: int = _DECODE.seed  # seeds sampling (temperature > 0)

    def options(self) -> TranscribeOptions:
        """The long-form options these controls stand for; ValueError names a bad value."""
        gamma = int(self.gamma)
        decode = replace(
            _DECODE,
            mode=self.mode,
            temperature=float(self.temperature),  # the start of the fallback schedule below
            gamma=gamma,
            gamma_policy=self.gamma_policy,
            gamma_max=max(_DECODE.gamma_max, gamma),
            draft_stop=float(self.draft_stop),
            sigmoid_scale=(float(self.sigmoid_alpha), float(self.sigmoid_beta)),
            language=None if self.language == "auto" else self.language,
            task=self.task,
            timestamps=bool(self.timestamps),
            seed=int(self.seed),
            timing=True,  # the statistics table shows the verifier time
        )
        return replace(_TRANSCRIBE, decode=decode, temperatures=fallback_schedule(float(self.temperature)))


class InputError(ValueError):
    """A request the app cannot serve as asked; the message is meant for the user."""


def load_input(path: str | None, limits: AppOptions) -> np.ndarray:
    """An uploaded or recorded file -> float32 mono 16 kHz samples, within the app's limits."""
    if not path:
        raise InputError("Record or upload some audio first.")
    size_mb = os.path.getsize(path) / MIB
    if size_mb > limits.max_upload_mb:
        raise InputError(
            f"The file is {size_mb:.1f} MB; this app takes files up to {limits.max_upload_mb:g} MB."
        )
    try:
        samples = load_audio(path)  # float32 mono 16 kHz
    except AudioError as e:
        raise InputError(f"Cannot read this audio: {e.reason}.") from e
    seconds = len(samples) / SAMPLE_RATE
    if seconds > limits.max_seconds:
        raise InputError(f"The audio is {seconds:.1f} s long; this app takes up to {limits.max_seconds:g} s.")
    return samples


@dataclass
class Run:
    """One transcription of the request's audio."""

    mode: str
    segments: list[Segment]
    info: TranscriptionInfo
    wall_s: float  # seconds from the call to the last segment, encoder included

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments).strip()

    @property
    def tokens(self) -> list[int]:
        return [t for s in self.segments for t in s.tokens]

    @property
    def real_time_factor(self) -> float:
        """Wall seconds per second of audio (below 1: faster than real time)."""
        return self.wall_s / self.info.duration

    def transcript(self, timestamps: bool) -> str:
        """The text, or one `[start → end] text` line per segment."""
        if not timestamps:
            return self.text
        return "\n".join(f"[{s.start:.2f} → {s.end:.2f}] {s.text.strip()}" for s in self.segments)

    def stats_rows(self) -> list[tuple[str, str]]:
        s = self.info.stats
        return [
            ("mode", self.mode),
            ("α̂ per token (accepted / reached draft tokens)", _ratio(s.token_acceptance, s.proposed)),
            ("accepted / proposed draft tokens", _ratio(s.acceptance_rate, s.proposed)),
            ("tokens per target call", f"{s.tokens_per_target_call:.2f}"),
            ("target calls", str(s.target_calls)),
            ("draft calls", str(s.draft_calls)),
            ("draft runs ended by the confidence stop", str(s.draft_stops)),
            ("verifier time", f"{s.verify_s * 1e3:.1f} ms"),
            (
                "real-time factor",
                f"{self.real_time_factor:.3f} ({self.wall_s:.2f} s for {self.info.duration:.2f} s)",
            ),
        ]


def run(pair, samples: np.ndarray, controls: Controls) -> Run:
    """Transcribes samples (float32 mono 16 kHz) with the models shared by every request."""
    from specasr.transcription import transcribe

    options = controls.options()
    t0 = time.perf_counter()
    segments, info = transcribe(samples, pair, options, source_rate=SAMPLE_RATE)
    done = list(segments)
    return Run(controls.mode, done, info, time.perf_counter() - t0)


@dataclass
class Comparison:
    reference: Run  # autoregressive: target only
    candidate: Run  # the chosen mode

    @property
    def speedup(self) -> float:
        """End to end: autoregressive wall time / the chosen mode's."""
        return self.reference.wall_s / self.candidate.wall_s

    @property
    def decoder_speedup(self) -> float:
        """The decoding loops alone, without audio loading and the encoder."""
        ref, cand = self.reference.info.stats.decoder_s, self.candidate.info.stats.decoder_s
        return ref / cand if cand else 0.0

    @property
    def identical(self) -> bool:
        return self.reference.tokens == self.candidate.tokens

    def summary(self) -> str:
        same = "identical tokens" if self.identical else "**the transcripts differ** (highlighted)"
        return (
            f"**Speedup {self.speedup:.2f}×** end to end ({self.reference.wall_s:.2f} s autoregressive, "
            f"{self.candidate.wall_s:.2f} s {self.candidate.mode}); "
            f"decoder loop {self.decoder_speedup:.2f}×; {same}. One measurement: rerun for another."
        )


def compare(pair, samples: np.ndarray, controls: Controls) -> Comparison:
    """Autoregressive and the chosen mode on the same samples and settings, one after the other."""
    if controls.mode == "autoregressive":
        raise InputError(
            "Pick a speculative mode (baseline, exact or sigmoid) to compare with autoregressive."
        )
    reference = run(pair, samples, replace(controls, mode="autoregressive"))
    return Comparison(reference, run(pair, samples, controls))


Highlighted = list[tuple[str, str | None]]  # (text, label or None): Gradio's HighlightedText value


def word_diff(a: str, b: str, label: str = "differs") -> tuple[Highlighted, Highlighted]:
    """Both texts as word runs, with the runs that the other text lacks or changes labelled."""
    wa, wb = a.split(), b.split()
    left: Highlighted = []
    right: Highlighted = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, wa, wb, autojunk=False).get_opcodes():
        tag = None if op == "equal" else label
        if i2 > i1:
            left.append((" ".join(wa[i1:i2]) + " ", tag))
        if j2 > j1:
            right.append((" ".join(wb[j1:j2]) + " ", tag))
    return left, right
