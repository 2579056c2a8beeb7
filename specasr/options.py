"""Option dataclasses: one place for defaults, one comment per field, validated once.

Front ends build these and override fields with `dataclasses.replace`; no parameter list
is copied into a second signature.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

from specasr.constants import BACKENDS, MODES

GAMMA_POLICIES = ("auto", "fixed", "adaptive", "analytic", "backoff")
SAMPLING_RULES = ("coupled", "rejection")
# the front ends' name for "detect the language" (`DecodeOptions.language` None), the default of
# the CLI, the app and `transcribe` (`TranscribeOptions`); one window's `DecodeOptions` says "en"
DETECT_LANGUAGE = "auto"


# What the front ends (CLI, app, server) accept, checked before anything loads: γ up to the
# adaptive policies' bound; a temperature up to the end of Whisper's fallback schedule (OpenAI's
# API takes 0–1 too); a seed torch.Generator.manual_seed takes.
GAMMA_LIMIT = 16
MAX_TEMPERATURE = 1.0
SEED_LIMIT = 2**63  # 0 <= seed < SEED_LIMIT
# beams (T = 0) and best-of candidates (T > 0) are rows of one batch per window
MAX_BEAMS = 16


def language_of(name: str) -> str | None:
    """A front end's language name -> `DecodeOptions.language`: DETECT_LANGUAGE -> None."""
    return None if name == DETECT_LANGUAGE else name


@dataclass(frozen=True)
class DecodeOptions:
    mode: str = "exact"  # autoregressive (target only) | baseline | exact | sigmoid verifier
    temperature: float = 0.0  # 0 = greedy; > 0 samples from softmax(logits / T)
    gamma: int = 7  # draft tokens per step (at most, with draft_stop): fixed value or adaptive start
    gamma_policy: str = "auto"  # auto (CPU: backoff, CUDA: adaptive) | fixed | adaptive | analytic | backoff
    gamma_max: int = GAMMA_LIMIT  # upper bound for the adaptive and analytic policies
    draft_stop: float = 0.6  # stop drafting once q(proposal) < this (0 = always γ); exact
    # the draft reads at most the last N tokens of a <|startofprev|> prompt (None: all); the
    # target always reads all of it, so this moves α, never the output. 32: held-out long-form
    draft_prompt: int | None = 32
    language: str | None = "en"  # language code for multilingual models; None = detect (long-form)
    task: str = "transcribe"  # transcribe | translate
    timestamps: bool = False  # predict timestamp tokens (and apply Whisper's timestamp rules)
    max_new_tokens: int | None = None  # None = up to the model's 448-token context
    sigmoid_scale: tuple[float, float] = (-1e3, 1e3)  # (α, β) of the sigmoid verifier
    seed: int = 0  # seeds the torch.Generator behind every random draw
    # how speculation samples (T > 0; decode/race.py): coupled (every token the target's race
    # winner under noise keyed by (seed, row, position): the autoregressive tokens for the seed,
    # in every mode) | rejection (Leviathan's rule, the paper's kernels: the same distribution,
    # other tokens). The sigmoid mode keeps its own approximate rule
    sampling: str = "coupled"
    suppress_blank: bool = True  # suppress " " and <|endoftext|> as the first sampled token
    suppress_tokens: bool = True  # suppress the model's non-speech tokens (generation config)
    suppress_ids: tuple[int, ...] = ()  # more token ids never to emit, besides (or without) those
    # the first timestamp is at most this many seconds in (Whisper's rule; None: anywhere)
    max_initial_timestamp: float | None = 1.0
    # text every row is forced to begin with (after <|0.00|> with timestamps), decoded on from
    # there; its tokens are part of the result. Long-form decoding forces it on the first window
    prefix: str | None = None
    # Whisper's search (decode/beam.py): at T = 0 a beam search over this many beams (1: greedy),
    # ended when round(beam_size * patience) hypotheses have finished; above T = 0, best_of
    # independent samples per window. Either way the result is the candidate with the highest
    # sum of log-probs / penalty(length): the length (None) or ((5 + length) / 6) ** length_penalty
    beam_size: int = 1
    best_of: int = 1
    patience: float = 1.0
    length_penalty: float | None = None
    # beams in a speculative mode: the draft proposes each beam's continuation (the same tokens
    # as target-only beams, in fewer target passes). None: on accelerators only; on a CPU a pass
    # over every beam's γ+1 tokens costs more than the passes saved (docs/benchmarks.md)
    speculative_beams: bool | None = None
    backend: str = "auto"  # verifier backend: auto | triton | torch
    timing: bool = False  # time the loop's phases into DecodeStats (CUDA: events); off costs nothing
    # CUDA, T = 0: decode in the device loop (`decode.graphed`: one CUDA graph per step, one
    # host read; timestamps and prompts included); False keeps the host loop (same tokens)
    device_loop: bool = True
    # the device loop's target passes: "matched" runs every one over 1 + the largest γ these
    # options draft tokens per row, target-only decoding too, so each token's fp16 arithmetic is
    # the same in every mode and exact's tokens are autoregressive's bit for bit (on a GPU a
    # product's rounding follows its shape); "natural" runs γ + 1 (target only: 1), faster
    # target-only passes, but an fp16 near-tie can then flip a token between modes (docs/gpu.md)
    device_width: str = "matched"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.gamma_policy not in GAMMA_POLICIES:
            raise ValueError(f"gamma_policy must be one of {GAMMA_POLICIES}, got {self.gamma_policy!r}")
        if self.sampling not in SAMPLING_RULES:
            raise ValueError(f"sampling must be one of {SAMPLING_RULES}, got {self.sampling!r}")
        if self.device_width not in ("matched", "natural"):
            raise ValueError(f"device_width must be matched or natural, got {self.device_width!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 1 <= self.gamma <= self.gamma_max:
            raise ValueError(f"need 1 <= gamma <= gamma_max, got {self.gamma} and {self.gamma_max}")
        if not 0 <= self.draft_stop < 1:
            raise ValueError(f"draft_stop must be in [0, 1), got {self.draft_stop}")
        if self.draft_prompt is not None and self.draft_prompt < 0:
            raise ValueError(f"draft_prompt must be >= 0 or None, got {self.draft_prompt}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be transcribe or translate, got {self.task!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.suppress_ids):
            raise ValueError(f"suppress_ids must be token ids >= 0, got {self.suppress_ids}")
        mit = self.max_initial_timestamp
        if mit is not None and not (math.isfinite(mit) and 0 <= mit <= 30):
            raise ValueError(f"max_initial_timestamp must be within [0, 30] s or None, got {mit}")
        for name in ("beam_size", "best_of"):
            n = getattr(self, name)
            if not (isinstance(n, int) and 1 <= n <= MAX_BEAMS):
                raise ValueError(f"{name} must be a whole number in [1, {MAX_BEAMS}], got {n!r}")
        if not (math.isfinite(self.patience) and self.patience > 0):
            raise ValueError(f"patience must be a finite number > 0, got {self.patience}")
        lp = self.length_penalty
        if lp is not None and not (math.isfinite(lp) and 0 <= lp <= 1):
            raise ValueError(f"length_penalty must be within [0, 1] or None, got {lp}")
        lo, hi = self.sigmoid_scale
        if not lo < hi:
            raise ValueError(f"sigmoid_scale needs α < β, got {self.sigmoid_scale}")

    @property
    def speculative(self) -> bool:
        return self.mode != "autoregressive"

    @property
    def candidates(self) -> int:
        """Rows decoded per window: beams at T = 0, samples above."""
        return self.beam_size if self.temperature == 0 else self.best_of

    @property
    def coupled(self) -> bool:
        """Whether sampling draws each position's keyed race (`sampling`; not the sigmoid mode)."""
        return self.sampling == "coupled" and self.mode != "sigmoid"


@dataclass(frozen=True)
class VadOptions:
    """Voice activity detection (longform/vad.py): which stretches of audio are decoded."""

    threshold: float = 0.5  # speech starts where Silero's P(speech) reaches this
    neg_threshold: float | None = None  # and ends where it stays below this (None: threshold - 0.15)
    min_speech: float = 0.25  # seconds: shorter speech chunks are dropped
    min_silence: float = 1.0  # seconds below neg_threshold that end a speech chunk
    speech_pad: float = 0.4  # seconds of audio kept before and after each speech chunk
    # seconds, padding included: a longer speech chunk is split at its last pause (of >= 98 ms), or
    # hard without one (Silero's and faster-whisper's max_speech_duration_s); inf = never split
    max_speech_duration_s: float = math.inf

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ValueError(f"vad threshold must be in (0, 1), got {self.threshold}")
        if self.neg_threshold is not None and not 0 <= self.neg_threshold <= self.threshold:
            raise ValueError(f"vad neg_threshold must be in [0, threshold], got {self.neg_threshold}")
        for name in ("min_speech", "min_silence", "speech_pad"):
            seconds = getattr(self, name)
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"vad {name} must be a finite number of seconds >= 0, got {seconds}")
        # a chunk of one 32 ms VAD probability, padded on both sides, must fit
        if not self.max_speech_duration_s > 2 * self.speech_pad + 0.032:
            raise ValueError(
                f"vad max_speech_duration_s must exceed 2 * speech_pad + 0.032 s (a padded 32 ms chunk "
                f"of speech), got {self.max_speech_duration_s}"
            )

    @property
    def end_threshold(self) -> float:
        return self.neg_threshold if self.neg_threshold is not None else max(self.threshold - 0.15, 0.01)


STRATEGIES = ("sequential", "chunked")
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def fallback_schedule(temperature: float) -> tuple[float, ...]:
    """The starting temperature, then +0.2 steps up to 1.0 (Whisper's fallback schedule)."""
    steps = [temperature]
    while steps[-1] + 0.2 <= 1.0 + 1e-9:
        steps.append(round(steps[-1] + 0.2, 6))
    return tuple(steps)


@dataclass(frozen=True)
class TranscribeOptions:
    # per-window decoding. Three of its fields are set per window, not used as given:
    # temperature runs through `temperatures` (so it must equal temperatures[0], the start);
    # language is the given one, or, None (the default), the one detected on the first window;
    # seed is a base: window k (sequential) or the batch starting at window k (chunked) draws
    # with seed + k, so every window samples from its own stream.
    decode: DecodeOptions = DecodeOptions(timestamps=True, max_new_tokens=224, language=None)
    strategy: str = "sequential"  # sequential (Whisper's seek loop) | chunked (spans cut at pauses, batched)
    temperatures: tuple[float, ...] = FALLBACK_TEMPERATURES  # fallback schedule, from decode.temperature
    compression_ratio_threshold: float | None = 2.4  # fall back when gzip ratio of the text is above
    logprob_threshold: float | None = -1.0  # fall back when the average log-prob is below
    no_speech_threshold: float | None = 0.6  # skip a window with P(nospeech) above and low log-prob
    condition_on_previous_text: bool = True  # prompt each window with the text so far (sequential)
    prompt_reset_temperature: float = 0.5  # a window decoded above this T does not prompt the next
    initial_prompt: str | None = None  # text prompting the first window (every window when chunked)
    # words prompting every window, before the previous text (names, terms to spell as given);
    # not on a window that decode.prefix forces. decode.prefix forces the first window only
    hotwords: str | None = None
    # detection (decode.language None): a window whose likeliest language is below this
    # probability lets the next window vote too, up to `language_detection_segments` windows
    # (faster-whisper's rule); then the language most windows chose, the likeliest on a tie
    language_detection_threshold: float = 0.5
    language_detection_segments: int = 1
    # detect every window's language and decode it in that one (faster-whisper's multilingual;
    # sequential, no language given): a recording that changes language is transcribed in each,
    # and each segment says which (Segment.language); info.language stays the first window's
    multilingual: bool = False
    batch_size: int = 8  # windows per batched decode (chunked)
    cut_search: float = 10.0  # chunked: a span ends at the quietest point of its last cut_search s
    trim_silence: bool = True  # move each segment end back to its last voiced frame (timing.py)
    vad: VadOptions | None = None  # decode only the speech Silero VAD finds (longform/vad.py); None = all
    # decode only these spans, seconds (start1, end1, start2, end2, ...; an odd count's last runs
    # to the end: openai-whisper's clip_timestamps); None or () = all. They are joined and decoded
    # as one audio, every time mapped back to the recording (longform/spans.py); with vad, speech
    # is searched inside the clips only
    clip_timestamps: tuple[float, ...] | None = None
    # time every word by cross-attention alignment (longform/words.py): one teacher-forced target
    # pass per window; segment bounds then come from the words, so trim_silence is not applied
    word_timestamps: bool = False
    # with word timestamps: punctuation that joins the word after it ("(" + "word"), and the word
    # before it ("word" + ","); a word whose text (stripped) is found in the string joins, as in
    # openai-whisper, whose defaults these are. "" keeps every such mark a word of its own
    prepend_punctuations: str = "\"'“¿([{-"
    append_punctuations: str = "\"'.。,，!！?？:：”)]}、"
    # with word timestamps (sequential): seconds of silence around a likely hallucinated segment
    # (longform/hallucination.py) that skip it, and the silence before it; None skips nothing
    hallucination_silence_threshold: float | None = None
    # a window whose samples never reach this peak (|x|, full scale 1) is digital silence and is
    # skipped undecoded (Whisper hears " you" in zeros); None decodes every window. -60 dBFS: far
    # below speech at any usual gain, above 16-bit dither (longform/windows.py, `quiet_frames`)
    silence_peak: float | None = 10 ** (-60 / 20)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        temps = self.temperatures
        if not temps or not all(math.isfinite(t) and t >= 0 for t in temps) or list(temps) != sorted(temps):
            raise ValueError(
                f"temperatures must be a non-empty ascending tuple of finite values >= 0, got {temps}"
            )
        if self.decode.temperature != temps[0]:
            raise ValueError(
                f"decode.temperature {self.decode.temperature:g} conflicts with the fallback schedule "
                f"{temps}: long-form decoding starts at temperatures[0] = {temps[0]:g}; pass "
                f"temperatures=fallback_schedule({self.decode.temperature:g}) (or a schedule starting "
                f"there), or set decode.temperature to {temps[0]:g}"
            )
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0 <= self.cut_search <= 20:
            raise ValueError(f"cut_search must be within [0, 20] s of a 30 s window, got {self.cut_search}")
        if self.silence_peak is not None and not 0 <= self.silence_peak < 1:
            raise ValueError(f"silence_peak must be a level within [0, 1), got {self.silence_peak}")
        for name in ("prepend_punctuations", "append_punctuations"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string of punctuation marks, got {getattr(self, name)!r}")
        hst = self.hallucination_silence_threshold
        if hst is not None:
            if not (isinstance(hst, numbers.Real) and math.isfinite(hst) and hst > 0):
                raise ValueError(f"hallucination_silence_threshold must be seconds > 0 or None, got {hst}")
            if not self.word_timestamps:
                raise ValueError("hallucination_silence_threshold needs word_timestamps (word times)")
            if self.strategy != "sequential":
                raise ValueError(
                    "hallucination_silence_threshold needs the sequential strategy: it moves the seek "
                    "of Whisper's loop, which a chunked span does not re-decode from"
                )
        if not 0 <= self.language_detection_threshold <= 1:
            raise ValueError(
                f"language_detection_threshold must be a probability, got {self.language_detection_threshold}"
            )
        if self.language_detection_segments < 1:
            raise ValueError(
                f"language_detection_segments must be >= 1, got {self.language_detection_segments}"
            )
        if self.multilingual and (self.strategy != "sequential" or self.decode.language is not None):
            raise ValueError(
                "multilingual detects each window's language: it needs the sequential strategy (a "
                "chunked batch decodes its rows in one language) and no language given"
            )
        if self.decode.prefix and self.strategy != "sequential":
            raise ValueError(
                "a prefix forces the first window's first words: use the sequential strategy "
                "(a chunked batch's rows share one start sequence)"
            )
        if self.no_speech_threshold is not None and not 0 <= self.no_speech_threshold <= 1:
            raise ValueError(f"no_speech_threshold must be a probability, got {self.no_speech_threshold}")
        clips = self.clip_timestamps
        if clips is not None and not isinstance(clips, tuple):
            raise ValueError(f"clip_timestamps must be a tuple of seconds or None, got {clips!r}")
        if clips and not all(isinstance(t, numbers.Real) and math.isfinite(t) and t >= 0 for t in clips):
            raise ValueError(f"clip_timestamps must be finite seconds >= 0, got {clips}")
        if clips and (list(clips) != sorted(clips) or any(b <= a for a, b in zip(clips[::2], clips[1::2]))):
            raise ValueError(
                f"clip_timestamps must be ascending (start1, end1, start2, ...) with each clip ending "
                f"after it starts and no two overlapping, got {clips}"
            )

    def with_decode(self, **changes) -> TranscribeOptions:
        """These options with `decode` fields replaced: o.with_decode(mode="autoregressive").

        A new temperature starts Whisper's fallback schedule there (`fallback_schedule`) when
        the schedule was the one from the old temperature; another schedule must be replaced
        with it (`dataclasses.replace(o, decode=..., temperatures=...)`)."""
        decode = replace(self.decode, **changes)
        temperatures = self.temperatures
        if decode.temperature != self.decode.temperature and temperatures == fallback_schedule(
            self.decode.temperature
        ):
            temperatures = fallback_schedule(decode.temperature)
        return replace(self, decode=decode, temperatures=temperatures)


def parse_clip_timestamps(text: str) -> tuple[float, ...]:
    """openai-whisper's `--clip_timestamps` "start,end,start,end,…" in seconds (an odd count:
    the last clip runs to the end; "" or "0": the whole audio) -> the tuple of seconds.
    ValueError names a bad value; TranscribeOptions checks the order."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        seconds = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError(f"clip_timestamps takes comma-separated seconds, got {text!r}") from None
    if not all(math.isfinite(t) for t in seconds):
        raise ValueError(f"clip_timestamps must be finite seconds, got {text!r}")
    return () if seconds == (0.0,) else seconds


def parse_suppress_tokens(text: str) -> tuple[bool, tuple[int, ...]]:
    """openai-whisper's `--suppress_tokens`: comma-separated token ids, -1 standing for the
    model's non-speech set -> (`DecodeOptions.suppress_tokens`, `suppress_ids`). "-1" is the
    default; "" suppresses nothing. ValueError names a bad value."""
    try:
        ids = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ValueError(
            f"suppress_tokens takes comma-separated token ids (-1: the model's set), got {text!r}"
        ) from None
    if any(i < -1 for i in ids):
        raise ValueError(f"suppress_tokens takes token ids >= 0, or -1 for the model's set, got {text!r}")
    return -1 in ids, tuple(dict.fromkeys(i for i in ids if i >= 0))


# Whisper's decoding options by the front ends' names (`front_end_options`' keywords beyond the
# common ones): the CLI's options and the server's form fields of the same names; None where a
# threshold is off
WHISPER_DEFAULTS = {
    "initial_prompt": None,
    "prefix": None,
    "hotwords": None,
    "condition_on_previous_text": True,
    "compression_ratio_threshold": 2.4,
    "logprob_threshold": -1.0,
    "no_speech_threshold": 0.6,
    "max_initial_timestamp": 1.0,
    "suppress_tokens": "-1",
    "clip_timestamps": "0",
    "hallucination_silence_threshold": None,
    "prepend_punctuations": "\"'“¿([{-",
    "append_punctuations": "\"'.。,，!！?？:：”)]}、",
    "language_detection_threshold": 0.5,
    "language_detection_segments": 1,
    "multilingual": False,
    "vad_max_speech": math.inf,
    "beam_size": DecodeOptions.beam_size,
    "best_of": DecodeOptions.best_of,
    "patience": DecodeOptions.patience,
    "length_penalty": DecodeOptions.length_penalty,
}
OFF_WITH_NONE = (
    "compression_ratio_threshold",
    "logprob_threshold",
    "no_speech_threshold",
    "max_initial_timestamp",
)


def front_end_options(
    *,
    mode: str = "exact",
    temperature: float = 0.0,
    gamma: int = DecodeOptions.gamma,
    gamma_policy: str = DecodeOptions.gamma_policy,
    draft_stop: float = DecodeOptions.draft_stop,
    sampling: str = DecodeOptions.sampling,
    language: str = DETECT_LANGUAGE,
    task: str = "transcribe",
    seed: int = 0,
    timing: bool = False,
    without_timestamps: bool = False,
    strategy: str = TranscribeOptions.strategy,
    vad: bool = False,
    vad_threshold: float = VadOptions.threshold,
    vad_min_silence: float = VadOptions.min_silence,
    batch_size: int = TranscribeOptions.batch_size,
    word_timestamps: bool = False,
    **whisper,
) -> TranscribeOptions:
    """The options a front end's values stand for (`specasr transcribe`, `specasr serve`), by
    the CLI's names: both build them here, so one file gives one transcript through either.
    `language` is a code or DETECT_LANGUAGE; `temperature` starts the fallback schedule;
    `whisper` takes WHISPER_DEFAULTS' names (clip and suppress lists as openai-whisper's
    strings). ValueError names a bad value."""
    unknown = sorted(set(whisper) - set(WHISPER_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(unknown)}")
    # None turns a threshold off (as in TranscribeOptions); elsewhere it means the default
    w = {
        k: whisper.get(k, v) if whisper.get(k) is not None or k in OFF_WITH_NONE else v
        for k, v in WHISPER_DEFAULTS.items()
    }
    suppress, suppress_ids = parse_suppress_tokens(w["suppress_tokens"])
    base = TranscribeOptions()
    decode = replace(
        base.decode,
        mode=mode,
        temperature=temperature,
        gamma=gamma,
        gamma_policy=gamma_policy,
        draft_stop=draft_stop,
        sampling=sampling,
        language=language_of(language),
        task=task,
        seed=seed,
        timing=timing,
        timestamps=not without_timestamps,
        prefix=w["prefix"] or None,
        max_initial_timestamp=w["max_initial_timestamp"],
        suppress_tokens=suppress,
        suppress_ids=suppress_ids,
        beam_size=w["beam_size"],
        best_of=w["best_of"],
        patience=w["patience"],
        length_penalty=w["length_penalty"],
    )
    vad_options = None
    if vad:
        vad_options = VadOptions(
            threshold=vad_threshold, min_silence=vad_min_silence, max_speech_duration_s=w["vad_max_speech"]
        )
    return replace(
        base,
        decode=decode,
        strategy=strategy,
        vad=vad_options,
        batch_size=batch_size,
        temperatures=fallback_schedule(temperature),
        word_timestamps=word_timestamps,
        initial_prompt=w["initial_prompt"] or None,
        hotwords=w["hotwords"] or None,
        condition_on_previous_text=bool(w["condition_on_previous_text"]),
        compression_ratio_threshold=w["compression_ratio_threshold"],
        logprob_threshold=w["logprob_threshold"],
        no_speech_threshold=w["no_speech_threshold"],
        clip_timestamps=parse_clip_timestamps(w["clip_timestamps"]) or None,
        hallucination_silence_threshold=w["hallucination_silence_threshold"],
        prepend_punctuations=w["prepend_punctuations"],
        append_punctuations=w["append_punctuations"],
        language_detection_threshold=w["language_detection_threshold"],
        language_detection_segments=w["language_detection_segments"],
        multilingual=bool(w["multilingual"]),
    )
