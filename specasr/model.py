"""`WhisperModel`: specasr with faster-whisper's call shape.

    model = WhisperModel("base")  # the packaged target and its distilled draft
    segments, info = model.transcribe("talk.wav")
    text = "".join(s.text for s in segments)

A front end: it translates faster-whisper's names into `load_pair`'s arguments and a
`TranscribeOptions`, then calls `transcription.transcribe`, so the segments and the info are
the ones `specasr.transcribe` gives for the same options. Every other `TranscribeOptions` or
`DecodeOptions` field passes through `transcribe` by its own name (mode="autoregressive",
strategy="chunked", gamma=5, seed=1), so a field added there needs no change here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, fields, is_dataclass, replace
from typing import Any, BinaryIO

import numpy as np
import torch

from specasr.audio import AudioSource
from specasr.backends.cpu import set_threads
from specasr.constants import SAMPLE_RATE
from specasr.models.loading import load_pair
from specasr.options import (
    DecodeOptions,
    TranscribeOptions,
    VadOptions,
    fallback_schedule,
    language_of,
    parse_clip_timestamps,
    parse_suppress_tokens,
)
from specasr.results import Segment, TranscriptionInfo
from specasr.transcription import detect_language, transcribe

__all__ = ["COMPUTE_TYPES", "WhisperModel", "vad_options"]

# faster-whisper's compute types that mean the same here -> (`load_pair`'s compute type, dtype;
# None: load_pair's, fp16 on CUDA and fp32 on a CPU). "default" keeps the checkpoint's precision;
# int8 is int8 decoder products on fp32 activations (faster-whisper's int8 on a CPU); bfloat16 is
# the encoder's products in bf16 (`backends.cpu.bf16`), int8_bfloat16 both, as loading.py names it
COMPUTE_TYPES: dict[str, tuple[str, torch.dtype | None]] = {
    "default": ("float32", None),
    "auto": ("auto", None),
    "float32": ("float32", torch.float32),
    "float16": ("float32", torch.float16),
    "int8": ("int8", None),
    "int8_float32": ("int8", None),
    "bfloat16": ("bfloat16", None),
    "int8_bfloat16": ("int8_bfloat16", None),
}
DEVICES = ("auto", "cpu", "cuda")

# faster-whisper's VAD parameters in milliseconds -> the `VadOptions` field, in seconds; its
# others (threshold, neg_threshold, max_speech_duration_s) are VadOptions' own names
VAD_MILLISECONDS = {
    "min_speech_duration_ms": "min_speech",
    "min_silence_duration_ms": "min_silence",
    "speech_pad_ms": "speech_pad",
}

# pass-through names that a faster-whisper keyword of `transcribe` owns, and that keyword
_OWNED = {
    "decode": "the keywords of its fields",
    "temperatures": "temperature (a float starts the fallback schedule, a sequence is it)",
    "timestamps": "without_timestamps",
    "logprob_threshold": "log_prob_threshold",
    "vad": "vad_filter and vad_parameters",
}
# faster-whisper's keywords that name a field of specasr's by another name
_ALIASES = {"prompt_reset_on_temperature": "prompt_reset_temperature"}
_TRANSCRIBE_FIELDS = {f.name for f in fields(TranscribeOptions)}
_DECODE_FIELDS = {f.name for f in fields(DecodeOptions)}


def vad_options(parameters: dict[str, Any] | VadOptions | None) -> VadOptions:
    """faster-whisper's `vad_parameters` -> `VadOptions`: a dict by faster-whisper's names (ms
    converted to seconds: `VAD_MILLISECONDS`) or by VadOptions' own, or a faster-whisper VadOptions.
    Names not given keep VadOptions' defaults (specasr's, not faster-whisper's). An unknown name
    is a TypeError naming it."""
    if parameters is None:
        return VadOptions()
    if isinstance(parameters, VadOptions):
        return parameters
    if is_dataclass(parameters):  # faster-whisper's own VadOptions: its fields by its names
        parameters = asdict(parameters)
    known = {f.name for f in fields(VadOptions)}
    changes = {}
    for key, value in parameters.items():
        name = VAD_MILLISECONDS.get(key, key)
        if name not in known:
            raise TypeError(f"unknown VAD parameter {key!r}; known: {sorted(set(VAD_MILLISECONDS) | known)}")
        changes[name] = value / 1000 if key in VAD_MILLISECONDS else value
    return VadOptions(**changes)


def _translated(name: str, value: Any) -> dict[str, Any]:
    """A pass-through keyword's value, in faster-whisper's type where that differs from the
    field's -> the fields it sets."""
    if name == "suppress_tokens" and not isinstance(value, bool):  # token ids, -1: the model's set
        suppress, ids = parse_suppress_tokens(",".join(str(i) for i in value or ()))
        return {"suppress_tokens": suppress, "suppress_ids": ids}
    if name == "clip_timestamps" and isinstance(value, str):  # "start,end,...", "0": all
        return {name: parse_clip_timestamps(value) or None}
    if name == "clip_timestamps" and isinstance(value, list):
        return {name: tuple(value) or None}
    return {name: value}


def _source(audio: AudioSource | BinaryIO) -> tuple[AudioSource, int | None]:
    """faster-whisper's audio -> (what `load_audio` takes, its source_rate): a binary file object
    is read into bytes, and an array is at 16 kHz, as faster-whisper takes it."""
    if hasattr(audio, "read"):
        return audio.read(), None
    return audio, SAMPLE_RATE if isinstance(audio, np.ndarray) else None


class WhisperModel:
    """A target and its draft, loaded once, with faster-whisper's `WhisperModel` call shape.

    model_size_or_path: a preset ("base"), a Hugging Face or CTranslate2 directory, or a hub id.
    device: "auto" (CUDA when available), "cpu" or "cuda" (`device_index` picks the GPU).
    compute_type: one of `COMPUTE_TYPES`; another is a ValueError naming them.
    cpu_threads: > 0 runs torch and the fused C draft step on that many threads
        (`backends.cpu.set_threads`, for the whole process, as torch's setting is); 0 leaves them.
    draft: "default" (the preset's), None (target only) or any draft spec `load_pair` takes.
    mode: `DecodeOptions.mode` for every `transcribe`; None: "exact" with a draft, else
        "autoregressive".
    The loaded pair is `self.pair`, for specasr's own functions (`transcribe_clip`, `decode`).
    """

    def __init__(
        self,
        model_size_or_path: str = "base",
        device: str = "auto",
        device_index: int = 0,
        compute_type: str = "default",
        cpu_threads: int = 0,
        draft: str | None = "default",
        mode: str | None = None,
    ) -> None:
        if device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
        if compute_type not in COMPUTE_TYPES:
            raise ValueError(f"compute_type must be one of {tuple(COMPUTE_TYPES)}, got {compute_type!r}")
        if not (isinstance(cpu_threads, int) and cpu_threads >= 0):
            raise ValueError(f"cpu_threads must be a whole number >= 0, got {cpu_threads!r}")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dev = torch.device(f"cuda:{device_index}" if device == "cuda" else "cpu")
        compute, dtype = COMPUTE_TYPES[compute_type]
        if dtype == torch.float16 and dev.type != "cuda":
            raise ValueError("compute_type float16 runs on CUDA; on a CPU use default or float32")
        if mode is not None:
            DecodeOptions(mode=mode)  # a bad mode fails here, before the load
        if cpu_threads:  # before the load: the draft's C step takes its thread count then
            set_threads(cpu_threads)
        self.pair = load_pair(model_size_or_path, draft, device=dev, dtype=dtype, compute_type=compute)
        if mode is None:
            mode = "autoregressive" if self.pair.draft is None else DecodeOptions.mode
        elif mode != "autoregressive" and self.pair.draft is None:
            raise ValueError(f"mode {mode!r} needs a draft; pass draft='default' or mode='autoregressive'")
        self.mode = mode

    def transcribe(
        self,
        audio: AudioSource | BinaryIO,
        language: str | None = None,
        task: str = "transcribe",
        *,
        beam_size: int = 5,
        best_of: int = 5,
        patience: float = 1,
        length_penalty: float | None = 1,
        temperature: float | Sequence[float] = 0.0,
        initial_prompt: str | None = TranscribeOptions.initial_prompt,
        condition_on_previous_text: bool = TranscribeOptions.condition_on_previous_text,
        compression_ratio_threshold: float | None = TranscribeOptions.compression_ratio_threshold,
        log_prob_threshold: float | None = TranscribeOptions.logprob_threshold,
        no_speech_threshold: float | None = TranscribeOptions.no_speech_threshold,
        word_timestamps: bool = TranscribeOptions.word_timestamps,
        vad_filter: bool = False,
        vad_parameters: dict[str, Any] | VadOptions | None = None,
        without_timestamps: bool = False,
        **options: Any,
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """audio: a path, bytes, a binary file object, or a float array at 16 kHz.

        Returns `transcription.transcribe`'s (lazy segments, info). language None detects it
        on the first 30 s (multilingual models). temperature: a float starts Whisper's
        fallback schedule (`fallback_schedule`), a sequence is the schedule. vad_parameters
        (with vad_filter): see `vad_options`. beam_size (beams at T = 0; 1: greedy), best_of
        (samples per window above T = 0) and patience are `DecodeOptions`' fields, with
        faster-whisper's defaults. length_penalty: faster-whisper's 1 (its default) ranks by
        sum log-prob / length, which is `DecodeOptions.length_penalty` None; any other value
        in [0, 1] is openai-whisper's α, / ((5 + length) / 6) ** α (CTranslate2's / length ** α
        is not offered). Any other keyword names a `TranscribeOptions` or `DecodeOptions`
        field; an unknown one is a TypeError."""
        base = TranscribeOptions()
        schedule = (
            fallback_schedule(temperature) if isinstance(temperature, (int, float)) else tuple(temperature)
        )
        decode = {
            "mode": self.mode,
            "language": language_of(language),
            "task": task,
            "temperature": schedule[0] if schedule else base.decode.temperature,
            "timestamps": not without_timestamps,
            "beam_size": beam_size,
            "best_of": best_of,
            "patience": patience,
            "length_penalty": None if length_penalty == 1 else length_penalty,
        }
        whole = {
            "temperatures": schedule,
            "initial_prompt": initial_prompt,
            "condition_on_previous_text": condition_on_previous_text,
            "compression_ratio_threshold": compression_ratio_threshold,
            "logprob_threshold": log_prob_threshold,
            "no_speech_threshold": no_speech_threshold,
            "word_timestamps": word_timestamps,
            "vad": vad_options(vad_parameters) if vad_filter else None,
        }
        for key, value in options.items():
            name = _ALIASES.get(key, key)
            if name in _OWNED:
                raise TypeError(f"transcribe() sets {name} from {_OWNED[name]}, not by {key}=")
            if name not in _TRANSCRIBE_FIELDS and name not in _DECODE_FIELDS:
                raise TypeError(
                    f"transcribe() got an unexpected keyword argument {key!r}: neither one of "
                    "faster-whisper's that specasr implements nor a TranscribeOptions or "
                    "DecodeOptions field"
                )
            for field, v in _translated(name, value).items():
                (whole if field in _TRANSCRIBE_FIELDS else decode)[field] = v
        opts = replace(base, decode=replace(base.decode, **decode), **whole)
        source, rate = _source(audio)
        return transcribe(source, self.pair, opts, source_rate=rate)

    def detect_language(self, audio: AudioSource | BinaryIO) -> tuple[str, float, list[tuple[str, float]]]:
        """(language, probability, every language's probability, most likely first), detected
        on the first 30 s as `transcribe` does (`transcription.detect_language`)."""
        source, rate = _source(audio)
        return detect_language(source, self.pair, source_rate=rate)
