"""Option dataclasses: one place for defaults, one comment per field, validated once.

Front ends build these and override fields with `dataclasses.replace`; no parameter list
is copied into a second signature.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from specasr.constants import BACKENDS, MODES

GAMMA_POLICIES = ("auto", "fixed", "adaptive", "analytic", "backoff")
# the front ends' name for "detect the language" (`DecodeOptions.language` None), the default of
# the CLI, the app and `transcribe` (`TranscribeOptions`); one window's `DecodeOptions` says "en"
DETECT_LANGUAGE = "auto"


# What the front ends (CLI, app, server) accept, checked before anything loads: γ up to the
# adaptive policies' bound; a temperature up to the end of Whisper's fallback schedule (OpenAI's
# API takes 0–1 too); a seed torch.Generator.manual_seed takes.
GAMMA_LIMIT = 16
MAX_TEMPERATURE = 1.0
SEED_LIMIT = 2**63  # 0 <= seed < SEED_LIMIT


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
    suppress_blank: bool = True  # suppress " " and <|endoftext|> as the first sampled token
    suppress_tokens: bool = True  # suppress the model's non-speech tokens (generation config)
    backend: str = "auto"  # verifier backend: auto | triton | torch
    timing: bool = False  # time the loop's phases into DecodeStats (CUDA: events); off costs nothing
    # CUDA, T = 0: decode in the device loop (`decode.graphed`: one CUDA graph per step, one
    # host read; timestamps and prompts included); False keeps the host loop (same tokens)
    device_loop: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.gamma_policy not in GAMMA_POLICIES:
            raise ValueError(f"gamma_policy must be one of {GAMMA_POLICIES}, got {self.gamma_policy!r}")
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
        lo, hi = self.sigmoid_scale
        if not lo < hi:
            raise ValueError(f"sigmoid_scale needs α < β, got {self.sigmoid_scale}")

    @property
    def speculative(self) -> bool:
        return self.mode != "autoregressive"


@dataclass(frozen=True)
class VadOptions:
    """Voice activity detection (longform/vad.py): which stretches of audio are decoded."""

    threshold: float = 0.5  # speech starts where Silero's P(speech) reaches this
    neg_threshold: float | None = None  # and ends where it stays below this (None: threshold - 0.15)
    min_speech: float = 0.25  # seconds: shorter speech chunks are dropped
    min_silence: float = 1.0  # seconds below neg_threshold that end a speech chunk
    speech_pad: float = 0.4  # seconds of audio kept before and after each speech chunk

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ValueError(f"vad threshold must be in (0, 1), got {self.threshold}")
        if self.neg_threshold is not None and not 0 <= self.neg_threshold <= self.threshold:
            raise ValueError(f"vad neg_threshold must be in [0, threshold], got {self.neg_threshold}")
        for name in ("min_speech", "min_silence", "speech_pad"):
            seconds = getattr(self, name)
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"vad {name} must be a finite number of seconds >= 0, got {seconds}")

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
    batch_size: int = 8  # windows per batched decode (chunked)
    cut_search: float = 10.0  # chunked: a span ends at the quietest point of its last cut_search s
    trim_silence: bool = True  # move each segment end back to its last voiced frame (timing.py)
    vad: VadOptions | None = None  # decode only the speech Silero VAD finds (longform/vad.py); None = all
    # time every word by cross-attention alignment (longform/words.py): one teacher-forced target
    # pass per window; segment bounds then come from the words, so trim_silence is not applied
    word_timestamps: bool = False
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
        if self.no_speech_threshold is not None and not 0 <= self.no_speech_threshold <= 1:
            raise ValueError(f"no_speech_threshold must be a probability, got {self.no_speech_threshold}")

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


def front_end_options(
    *,
    mode: str = "exact",
    temperature: float = 0.0,
    gamma: int = DecodeOptions.gamma,
    gamma_policy: str = DecodeOptions.gamma_policy,
    draft_stop: float = DecodeOptions.draft_stop,
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
    initial_prompt: str | None = None,
) -> TranscribeOptions:
    """The options a front end's values stand for (`specasr transcribe`, `specasr serve`), by
    the CLI's names: both build them here, so one file gives one transcript through either.
    `language` is a code or DETECT_LANGUAGE; `temperature` starts the fallback schedule.
    ValueError names a bad value."""
    base = TranscribeOptions()
    decode = replace(
        base.decode,
        mode=mode,
        temperature=temperature,
        gamma=gamma,
        gamma_policy=gamma_policy,
        draft_stop=draft_stop,
        language=language_of(language),
        task=task,
        seed=seed,
        timing=timing,
        timestamps=not without_timestamps,
    )
    return replace(
        base,
        decode=decode,
        strategy=strategy,
        vad=VadOptions(threshold=vad_threshold, min_silence=vad_min_silence) if vad else None,
        batch_size=batch_size,
        temperatures=fallback_schedule(temperature),
        word_timestamps=word_timestamps,
        initial_prompt=initial_prompt or None,
    )
