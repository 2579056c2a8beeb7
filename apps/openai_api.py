"""OpenAI's audio API as `specasr serve` speaks it, with no web framework in it: the server's
settings, OpenAI's error object, and a request's form fields -> the options `specasr
transcribe` would use (apps/serve_work.py turns the transcript into the response body).

A request's options are built by `specasr.options.front_end_options` from the CLI's option
names, exactly as the CLI builds its own, so a file gives the same transcript through either
front end; every field left out takes the CLI's default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specasr.options import (
    DETECT_LANGUAGE,
    GAMMA_LIMIT,
    GAMMA_POLICIES,
    MAX_BEAMS,
    MAX_TEMPERATURE,
    MODES,
    SAMPLING_RULES,
    SEED_LIMIT,
    STRATEGIES,
    WHISPER_DEFAULTS,
    front_end_options,
)
from specasr.writers import FORMATS, SubtitleOptions

if TYPE_CHECKING:  # types only: `specasr serve --help` imports this module without torch
    from collections.abc import Sequence

    from specasr.options import TranscribeOptions

MIB = 2**20
ALIAS = "whisper-1"  # OpenAI's model name, accepted for the served model
RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
GRANULARITIES = ("segment", "word")
# OpenAI's fields that ask for what this server does not do
UNSUPPORTED = {
    "stream": "Streaming responses are not supported: leave out 'stream' or send false.",
    "chunking_strategy": "'chunking_strategy' is not supported: long audio is cut by the 'strategy' field.",
    "include[]": "'include[]' is not supported: responses carry no token log-probabilities.",
    "include": "'include' is not supported: responses carry no token log-probabilities.",
}


@dataclass(frozen=True)
class ServerSettings:
    """What `specasr serve` accepts and how much of it at once."""

    model: str | None = None  # the served model's id as --model named it (None: the target's name)
    api_key: str | None = None  # the Bearer key every /v1 request must carry (None: no key asked)
    max_upload_mb: float = 50.0  # largest uploaded file, in MiB
    max_seconds: float = 3600.0  # longest audio, in seconds (checked before it is all decoded)
    max_concurrent: int = 16  # transcriptions running at once; they decode together (SharedEngine)
    max_queue: int = 64  # requests allowed to wait beyond those; more are turned away (429)
    request_timeout: float = 600.0  # seconds from arrival to answer; a transcription past it stops (504)
    max_batch: int = 16  # rows of a shared decode batch (`SharedEngine(max_rows=...)`)

    def __post_init__(self) -> None:
        for name in ("max_upload_mb", "max_seconds", "request_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name, low in (("max_concurrent", 1), ("max_queue", 0), ("max_batch", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty (leave it out to serve without a key)")

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * MIB)


class ApiError(Exception):
    """A request that gets an error answer: HTTP `status` and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def shutting_down() -> ApiError:
    return ApiError(
        503,
        "The server is shutting down; send the request again later.",
        type="server_error",
        code="shutting_down",
    )


def too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"The file is larger than this server takes ({max_bytes / MIB:g} MiB).",
        param="file",
        code="file_too_large",
    )


def timed_out(seconds: float) -> ApiError:
    return ApiError(
        504,
        f"The request took longer than this server allows ({seconds:g} s).",
        type="server_error",
        code="timeout",
    )


@dataclass(frozen=True)
class Served:
    """What a request is checked against: the models that are loaded."""

    ids: tuple[str, ...]  # the names `model` may give, the served id first
    has_draft: bool  # speculative modes need one
    multilingual: bool
    languages: frozenset[str]  # the codes the model knows

    @classmethod
    def of(cls, pair, settings: ServerSettings) -> Served:
        tok = pair.tokenizer
        ids = dict.fromkeys(n for n in (settings.model, pair.target_name, ALIAS) if n)
        languages = frozenset(tok.language_tokens) if tok.multilingual else frozenset({"en"})
        return cls(tuple(ids), pair.draft is not None, tok.multilingual, languages)


# ---- form fields -> options -------------------------------------------------------------
def _choice(values: Sequence[str]):
    def parse(name: str, text: str) -> str:
        if text not in values:
            raise invalid(f"'{name}' must be one of {', '.join(values)}; got {text!r}", name)
        return text

    return parse


def _number(kind, low=None, high=None, low_open=False, high_open=False):
    """A parser of ints or finite floats within [low, high] (an end left open where asked)."""

    def parse(name: str, text: str):
        try:
            value = kind(text.strip())
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise invalid(f"'{name}' must be {what}; got {text!r}", name) from None
        if kind is float and not math.isfinite(value):
            raise invalid(f"'{name}' must be a finite number; got {text!r}", name)
        below = low is not None and (value <= low if low_open else value < low)
        above = high is not None and (value >= high if high_open else value > high)
        if below or above:
            lo = "" if low is None else f"{'(' if low_open else '['}{low:g}"
            hi = "" if high is None else f"{high:g}{')' if high_open else ']'}"
            where = f"in {lo}, {hi}" if lo and hi else f"{'>' if low_open else '>='} {low:g}"
            raise invalid(f"'{name}' must be {where}; got {text!r}", name)
        return value

    return parse


def _bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise invalid(f"'{name}' must be true or false; got {text!r}", name)


def _text(name: str, text: str) -> str:
    return text


def _optional(parse):
    """`parse`, or None for `none` (a threshold turned off)."""

    def optional(name: str, text: str):
        return None if text.strip().lower() == "none" else parse(name, text)

    return optional


def _outputs(name: str, text: str) -> tuple[str, ...]:
    names = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in names if f not in FORMATS]
    if unknown:
        raise invalid(
            f"'outputs' takes a comma-separated list of {', '.join(FORMATS)}; got {unknown[0]!r}", name
        )
    return tuple(dict.fromkeys(names))


# every field a request may send (but `file`), by OpenAI's names and the CLI's, and its parser
FIELDS = {
    "model": _text,
    "language": _text,
    "prompt": _text,
    "response_format": _choice(RESPONSE_FORMATS),
    "temperature": _number(float, 0, MAX_TEMPERATURE),
    "timestamp_granularities[]": _choice(GRANULARITIES),
    "mode": _choice(MODES),
    "gamma": _number(int, 1, GAMMA_LIMIT),
    "gamma_policy": _choice(GAMMA_POLICIES),
    "draft_stop": _number(float, 0, 1, high_open=True),
    "sampling": _choice(SAMPLING_RULES),
    "strategy": _choice(STRATEGIES),
    "batch_size": _number(int, 1),
    "vad": _bool,
    "vad_threshold": _number(float, 0, 1, low_open=True, high_open=True),
    "vad_min_silence": _number(float, 0),
    "seed": _number(int, 0, SEED_LIMIT - 1),
    "without_timestamps": _bool,
    "max_line_width": _number(int, 1),
    "max_line_count": _number(int, 1),
    "highlight_words": _bool,
    "outputs": _outputs,
    # Whisper's decoding options (`specasr.options.WHISPER_DEFAULTS`; OpenAI's `prompt` is the
    # initial prompt); lists as openai-whisper's strings, checked by `front_end_options`
    "prefix": _text,
    "hotwords": _text,
    "condition_on_previous_text": _bool,
    "multilingual": _bool,
    "compression_ratio_threshold": _optional(_number(float, 0)),
    "logprob_threshold": _optional(_number(float, None, 0)),
    "no_speech_threshold": _optional(_number(float, 0, 1)),
    "max_initial_timestamp": _optional(_number(float, 0, 30)),
    "suppress_tokens": _text,
    "clip_timestamps": _text,
    "hallucination_silence_threshold": _number(float, 0, low_open=True),
    "prepend_punctuations": _text,
    "append_punctuations": _text,
    "language_detection_threshold": _number(float, 0, 1),
    "language_detection_segments": _number(int, 1, 100),
    "vad_max_speech": _number(float, 0, low_open=True),
    # Whisper's search
    "beam_size": _number(int, 1, MAX_BEAMS),
    "best_of": _number(int, 1, MAX_BEAMS),
    "patience": _number(float, 0, low_open=True),
    "length_penalty": _optional(_number(float, 0, 1)),
}
_LISTS = {"timestamp_granularities[]"}  # fields that may be given more than once
_SPELLINGS = {"timestamp_granularities": "timestamp_granularities[]"}
# front_end_options' arguments that are form fields of the same name
_OPTION_FIELDS = (
    "mode",
    "temperature",
    "gamma",
    "gamma_policy",
    "draft_stop",
    "sampling",
    "strategy",
    "batch_size",
    "vad",
    "vad_threshold",
    "vad_min_silence",
    "seed",
    "without_timestamps",
    *(name for name in WHISPER_DEFAULTS if name != "initial_prompt"),
)


@dataclass(frozen=True)
class TranscriptionRequest:
    """One transcription request, checked: what to decode and how to answer."""

    task: str  # transcribe | translate
    response_format: str
    options: TranscribeOptions
    subtitles: SubtitleOptions  # srt/vtt layout of word-timed segments
    outputs: tuple[str, ...]  # specasr's writers' formats to render into verbose_json
    words: bool  # word timestamps asked for (`timestamp_granularities[]` word)


def parse_request(items: Sequence[tuple[str, str]], task: str, served: Served) -> TranscriptionRequest:
    """The form's text fields (name, value), in order -> a checked TranscriptionRequest; ApiError (400,
    or 404 for an unknown model) names the field at fault."""
    values: dict[str, Any] = {}
    for raw_name, text in items:
        name = _SPELLINGS.get(raw_name, raw_name)
        if name in UNSUPPORTED:
            if name == "stream" and text.strip().lower() in ("false", "0", ""):
                continue
            raise invalid(UNSUPPORTED[name], raw_name, "unsupported_parameter")
        if name not in FIELDS:
            raise invalid(f"Unknown field {raw_name!r}.", raw_name, "unknown_parameter")
        value = FIELDS[name](raw_name, text)
        if name in _LISTS:
            values.setdefault(name, []).append(value)
        elif name in values:
            raise invalid(f"Field {raw_name!r} is given more than once.", raw_name)
        else:
            values[name] = value
    model = values.get("model")
    if model is not None and model not in served.ids:
        raise ApiError(
            404,
            f"The model {model!r} does not exist: this server serves {', '.join(map(repr, served.ids))}",
            param="model",
            code="model_not_found",
        )
    words = "word" in values.get("timestamp_granularities[]", ())
    response_format = values.get("response_format", "json")
    outputs = values.get("outputs", ())
    if outputs and response_format != "verbose_json":
        raise invalid(
            "'outputs' comes back in verbose_json only: send response_format=verbose_json.", "outputs"
        )
    subtitles = _subtitles(values, words)
    language = _language(values.get("language"), task, served)
    args = {name: values[name] for name in _OPTION_FIELDS if name in values}
    if not served.has_draft:
        args.setdefault("mode", "autoregressive")  # the only mode a server without a draft runs
    if args.get("mode", "exact") != "autoregressive" and not served.has_draft:
        raise invalid(
            f"Mode {args['mode']!r} needs a draft model and this server runs none: "
            "use mode=autoregressive (or start the server with a --draft).",
            "mode",
        )
    try:
        options = front_end_options(
            **args,
            language=language,
            task=task,
            word_timestamps=words,
            initial_prompt=values.get("prompt"),
        )
    except ValueError as e:
        raise invalid(str(e)) from None
    return TranscriptionRequest(task, response_format, options, subtitles, outputs, words)


def _subtitles(values: dict, words: bool) -> SubtitleOptions:
    """The srt/vtt layout options, under the CLI's rules: they lay out timed words."""
    width, count = values.get("max_line_width"), values.get("max_line_count")
    highlight = values.get("highlight_words", False)
    if not words:
        for name in ("max_line_width", "max_line_count", "highlight_words"):
            if values.get(name):
                raise invalid(f"'{name}' lays out timed words: send timestamp_granularities[]=word.", name)
    if count is not None and width is None:
        raise invalid("'max_line_count' needs 'max_line_width'.", "max_line_count")
    return SubtitleOptions(width, count, highlight)


def _language(language: str | None, task: str, served: Served) -> str:
    """The language field -> a code or DETECT_LANGUAGE, checked against the model."""
    code = (language or "").strip().lower() or DETECT_LANGUAGE
    if not served.multilingual:
        if task == "translate":
            raise invalid(
                "This server's model is English-only and cannot translate.", None, "unsupported_task"
            )
        if code not in (DETECT_LANGUAGE, "en"):
            raise invalid(
                f"This server's model is English-only: language {language!r} is not available.", "language"
            )
    elif code != DETECT_LANGUAGE and code not in served.languages:
        raise invalid(
            f"Unknown language {language!r}: use a Whisper language code (en, de, fr, …) or 'auto'.",
            "language",
        )
    return code


def model_list(served: Served, created: int) -> dict:
    """GET /v1/models: OpenAI's list of model objects."""
    return {"object": "list", "data": [model_object(i, created) for i in served.ids]}


def model_object(model_id: str, created: int) -> dict:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "specasr"}
