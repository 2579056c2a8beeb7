"""What the app does with a request, with no Gradio in it: limits, options, runs, comparisons.

The Gradio layer (gradio_app.py) turns its widgets' values into `Controls`, calls `load_input`
and then `run` or `compare`, and shows what they return; `Downloads` writes a run's transcript
files. Decoding itself is the library's `transcribe`; nothing here decodes.
"""

from __future__ import annotations

import atexit
import contextlib
import difflib
import os
import re
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from specasr.constants import N_TEXT_CTX, SAMPLE_RATE
from specasr.options import (
    DETECT_LANGUAGE,
    GAMMA_LIMIT,
    MAX_BEAMS,
    MAX_TEMPERATURE,
    SEED_LIMIT,
    STRATEGIES,
    TranscribeOptions,
    VadOptions,
    fallback_schedule,
    language_of,
)

if TYPE_CHECKING:  # types only: `specasr app --help` does not load torch
    import numpy as np

    from specasr.results import Segment, TranscriptionInfo

MIB = 2**20
_TRANSCRIBE = TranscribeOptions()
_DECODE = _TRANSCRIBE.decode
# A window's start sequence keeps the last N_TEXT_CTX // 2 - 1 = 223 prompt tokens, hotwords
# first: a longer initial prompt would lose its start without a word. The character bound is
# checked before tokenizing (a request can send any text): 223 tokens of prose is ~1000 characters.
PROMPT_TOKENS = N_TEXT_CTX // 2 - 1
PROMPT_CHARS = 2000


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
    gamma_policy: str = _DECODE.gamma_policy  # auto | fixed | adaptive | analytic | backoff
    gamma: int = _DECODE.gamma  # draft tokens per step: the fixed value, or the start
    draft_stop: float = _DECODE.draft_stop  # end a draft run at a proposal with q(d) below (0 = off)
    temperature: float = _DECODE.temperature  # the first temperature; fallbacks step up by 0.2
    sigmoid_alpha: float = _DECODE.sigmoid_scale[0]  # α of the sigmoid verifier
    sigmoid_beta: float = _DECODE.sigmoid_scale[1]  # β of the sigmoid verifier
    language: str = DETECT_LANGUAGE  # a language code, or "auto" to detect it (English-only: en)
    task: str = _DECODE.task  # transcribe | translate
    timestamps: bool = _DECODE.timestamps  # decode timestamp tokens and show segment times
    seed: int = _DECODE.seed  # seeds sampling (temperature > 0)
    strategy: str = _TRANSCRIBE.strategy  # sequential (Whisper's seek loop) | chunked (batched spans)
    vad: bool = False  # decode only the speech Silero VAD finds (VadOptions' defaults)
    word_timestamps: bool = _TRANSCRIBE.word_timestamps  # time every word (json words, word-timed cues)
    initial_prompt: str = ""  # text prompting the first window (every window when chunked)
    hotwords: str = ""  # words prompting every window: names and terms to spell as given
    beam_size: int = _DECODE.beam_size  # beams at temperature 0 (1: greedy)

    def options(self) -> TranscribeOptions:
        """The long-form options these controls stand for; ValueError names a bad value."""
        gamma = int(self.gamma)
        seed = _whole(
            self.seed,
            0,
            SEED_LIMIT - 1,
            f"The seed must be a whole number from 0 to {SEED_LIMIT - 1} (2**63 - 1)",
        )
        beams = _whole(
            self.beam_size, 1, MAX_BEAMS, f"The beam size must be a whole number from 1 to {MAX_BEAMS}"
        )
        if not 1 <= gamma <= GAMMA_LIMIT:
            raise InputError(f"γ must be a whole number from 1 to {GAMMA_LIMIT}; got {self.gamma!r}.")
        if not 0 <= float(self.temperature) <= MAX_TEMPERATURE:
            message = f"The temperature must be from 0 to {MAX_TEMPERATURE:g}; got {self.temperature}."
            raise InputError(message)
        if self.strategy not in STRATEGIES:
            raise InputError(f"The strategy must be one of {', '.join(STRATEGIES)}; got {self.strategy!r}.")
        decode = replace(
            _DECODE,
            mode=self.mode,
            temperature=float(self.temperature),  # the start of the fallback schedule below
            gamma=gamma,
            gamma_policy=self.gamma_policy,
            draft_stop=float(self.draft_stop),
            sigmoid_scale=(float(self.sigmoid_alpha), float(self.sigmoid_beta)),
            language=language_of(self.language),
            task=self.task,
            timestamps=bool(self.timestamps),
            seed=seed,
            beam_size=beams,
            timing=True,  # the statistics table shows the verifier time
        )
        return replace(
            _TRANSCRIBE,
            decode=decode,
            temperatures=fallback_schedule(float(self.temperature)),
            strategy=self.strategy,
            vad=VadOptions() if self.vad else None,
            word_timestamps=bool(self.word_timestamps),
            initial_prompt=_prompt("initial prompt", self.initial_prompt),
            hotwords=_prompt("hotwords", self.hotwords),
        )

    def checked(self, tokenizer) -> TranscribeOptions:
        """`options`, with the prompts measured in the model's tokens (PROMPT_TOKENS at most)."""
        from specasr.longform.windows import hotword_tokens, initial_prompt_tokens  # torch

        options = self.options()
        n = len(hotword_tokens(tokenizer, options)) + len(initial_prompt_tokens(tokenizer, options))
        if n > PROMPT_TOKENS:
            raise InputError(
                f"The initial prompt and hotwords are {n} tokens together; Whisper keeps at most "
                f"{PROMPT_TOKENS}, so shorten them."
            )
        return options


class InputError(ValueError):
    """A request the app cannot serve as asked; the message is meant for the user."""


def _whole(value, low: int, high: int, message: str) -> int:
    """A widget's whole number (an int, or a float from JSON) -> int in [low, high]; InputError
    says `message` and the value otherwise."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # None, NaN, inf, text
        raise InputError(f"{message}; got {value!r}.") from None
    if number != value or not low <= number <= high:
        raise InputError(f"{message}; got {value!r}.")
    return number


def _prompt(label: str, text) -> str | None:
    """A prompt box's text -> the option (None when blank), within PROMPT_CHARS."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise InputError(f"The {label} must be text; got {text!r}.")
    if len(text) > PROMPT_CHARS:
        raise InputError(f"The {label} is {len(text)} characters; this app takes up to {PROMPT_CHARS}.")
    return text.strip() or None


def load_input(path: str | None, limits: AppOptions) -> np.ndarray:
    """An uploaded or recorded file -> float32 mono 16 kHz samples, within the app's limits."""
    from specasr.audio import AudioError, AudioTooLong, load_audio  # numpy: not for `specasr --help`

    if not path:
        raise InputError("Record or upload some audio first.")
    size_mb = os.path.getsize(path) / MIB
    if size_mb > limits.max_upload_mb:
        raise InputError(
            f"The file is {size_mb:.1f} MB; this app takes files up to {limits.max_upload_mb:g} MB."
        )
    try:  # the header's length is checked before decoding; decoding stops at the limit
        samples = load_audio(path, max_seconds=limits.max_seconds)  # float32 mono 16 kHz
    except AudioTooLong as e:
        if e.seconds is None:
            raise InputError(f"The audio is longer than this app takes ({limits.max_seconds:g} s).") from e
        raise InputError(
            f"The audio is {e.seconds:.1f} s long; this app takes up to {limits.max_seconds:g} s."
        ) from e
    except AudioError as e:
        raise InputError(f"Cannot read this audio: {e.reason}.") from e
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

    options = controls.checked(pair.tokenizer)
    t0 = time.perf_counter()
    segments, info = transcribe(samples, pair, options, source_rate=SAMPLE_RATE)
    done = list(segments)
    return Run(controls.mode, done, info, time.perf_counter() - t0)


class Downloads:
    """A run's transcript in every `specasr.writers` format, for download: one fresh folder per
    request (two requests never share a name) under one root, which `close` removes, as does
    the process's exit. A folder older than `keep_s` is removed at the next request."""

    def __init__(self, parent: str | None = None, keep_s: float = 3600.0) -> None:
        self.root = tempfile.mkdtemp(prefix="specasr-downloads-", dir=parent)
        self.keep_s = keep_s
        atexit.register(self.close)

    def write(self, result: Run, name: str | None = None) -> list[str]:
        """The files `<stem>.<fmt>`, stem from `name` (the upload's file name) or "transcript"."""
        from specasr.writers import FORMATS, write

        os.makedirs(self.root, exist_ok=True)  # again after `close`: a relaunched app serves on
        self._prune()
        stem = re.sub(r"[^\w.-]+", "_", os.path.splitext(os.path.basename(name or ""))[0])[:100]
        folder = tempfile.mkdtemp(dir=self.root)
        return [str(p) for p in write(result.segments, result.info, stem or "transcript", folder, FORMATS)]

    def _prune(self) -> None:
        cutoff = time.time() - self.keep_s
        for path in os.listdir(self.root):
            path = os.path.join(self.root, path)
            with contextlib.suppress(FileNotFoundError):  # a concurrent request pruned it first
                if os.lstat(path).st_mtime < cutoff:
                    shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


COMPARE_RUNS = 3  # "Compare" times each side this many times and reports the medians


@dataclass
class Comparison:
    reference: Run  # autoregressive: target only (its first run)
    candidate: Run  # the chosen mode (its first run)
    reference_walls: list[float] = field(default_factory=list)  # wall seconds of every run
    candidate_walls: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reference_walls = self.reference_walls or [self.reference.wall_s]
        self.candidate_walls = self.candidate_walls or [self.candidate.wall_s]

    @property
    def runs(self) -> int:
        return min(len(self.reference_walls), len(self.candidate_walls))

    @property
    def reference_s(self) -> float:
        return statistics.median(self.reference_walls)

    @property
    def candidate_s(self) -> float:
        return statistics.median(self.candidate_walls)

    @property
    def speedup(self) -> float:
        """End to end: median autoregressive wall time / the chosen mode's median."""
        return self.reference_s / self.candidate_s

    @property
    def decoder_speedup(self) -> float:
        """The decoding loops alone (first runs), without audio loading and the encoder."""
        ref, cand = self.reference.info.stats.decoder_s, self.candidate.info.stats.decoder_s
        return ref / cand if cand else 0.0

    @property
    def identical(self) -> bool:
        return self.reference.tokens == self.candidate.tokens

    def summary(self) -> str:
        same = "identical tokens" if self.identical else "**the transcripts differ** (highlighted)"
        runs = f"median of {self.runs} runs each" if self.runs > 1 else "one run each: expect noise"
        return (
            f"**Speedup {self.speedup:.2f}×** end to end ({self.reference_s:.2f} s autoregressive, "
            f"{self.candidate_s:.2f} s {self.candidate.mode}; {runs}); "
            f"decoder loop {self.decoder_speedup:.2f}× (first run); {same}."
        )


def compare(pair, samples: np.ndarray, controls: Controls, runs: int = COMPARE_RUNS) -> Comparison:
    """Autoregressive and the chosen mode on the same samples and settings, alternating, `runs`
    times each; the transcripts are the first runs', the speedup is the ratio of the medians."""
    if controls.mode == "autoregressive":
        raise InputError(
            "Pick a speculative mode (baseline, exact or sigmoid) to compare with autoregressive."
        )
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    references, candidates = [], []
    for _ in range(runs):
        references.append(run(pair, samples, replace(controls, mode="autoregressive")))
        candidates.append(run(pair, samples, controls))
    return Comparison(
        references[0],
        candidates[0],
        [r.wall_s for r in references],
        [c.wall_s for c in candidates],
    )


TOKEN_KINDS = {  # Segment.token_kinds -> the label the app shows
    "draft": "accepted draft",
    "corrected": "target-corrected",
    "bonus": "bonus",
    "target": "target only",
}


def token_spans(pair, run: Run) -> list[tuple[str, str | None]]:
    """The transcript as one (text, label) pair per token: where each token came from
    (`TOKEN_KINDS`), None when not known (chunked decoding). Timestamp and special tokens
    are left out; each token's text is what it adds to the decoded prefix, so characters
    split over byte tokens come out whole on the token that completes them."""
    tok = pair.tokenizer
    special = min(tok.eot, tok.sot)  # ids from here on are special or timestamps
    spans: list[tuple[str, str | None]] = []
    for segment in run.segments:
        kinds = segment.token_kinds if len(segment.token_kinds) == len(segment.tokens) else []
        text_tokens: list[int] = []
        before = ""
        for i, token in enumerate(segment.tokens):
            if token >= special:
                continue
            text_tokens.append(token)
            now = tok.decode(text_tokens)
            piece, before = now[len(before) :] if now.startswith(before) else now, now
            if piece:
                spans.append((piece, TOKEN_KINDS.get(kinds[i]) if kinds else None))
    return spans


def accepted_per_step(run: Run) -> list[tuple[int, int]]:
    """(draft tokens accepted, how many verify steps) for every count from 0 to the largest γ
    used: one step is one row's verify pass (`DecodeStats.accepted_hist`). Empty without a draft."""
    stats = run.info.stats
    if not stats.gammas:
        return []
    hist = stats.accepted_hist
    top = max(max(stats.gammas), max(hist, default=0))
    return [(n, int(hist.get(n, 0))) for n in range(top + 1)]


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
