"""What a request's worker thread does (apps/server.py runs it off the event loop): load the
uploaded file within the server's length limit, transcribe it through the shared engine,
checking the request's deadline and stop flag between segments, and turn the transcript into
OpenAI's response body."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specasr.audio import AudioError, AudioTooLong, load_audio
from specasr.constants import SAMPLE_RATE
from specasr.longform.engine import EngineClosed
from specasr.tokenizer import LANGUAGE_NAMES
from specasr.transcription import transcribe
from specasr.writers import render

from .openai_api import ApiError, TranscriptionRequest, invalid, shutting_down, timed_out

if TYPE_CHECKING:
    from collections.abc import Sequence

    from specasr.longform.engine import SharedEngine
    from specasr.results import Segment, TranscriptionInfo

    from .openai_api import ServerSettings


def transcribe_upload(
    path: Path,
    job: TranscriptionRequest,
    pair,
    engine: SharedEngine,
    settings: ServerSettings,
    deadline: float,
    stop: threading.Event,
) -> tuple[Any, str]:
    """The uploaded file -> (response body, media type). `deadline` (time.monotonic) and
    `stop` are checked between segments: past either, the transcription stops before its
    next window. ApiError: 413 for audio over `settings.max_seconds`, 400 for unreadable audio,
    504 past the deadline, 503 once the engine has closed."""
    max_seconds = settings.max_seconds
    try:
        samples = load_audio(path, max_seconds=max_seconds)  # float32 mono 16 kHz
    except AudioTooLong as e:
        message = f"The audio is longer than this server takes ({max_seconds:g} s)."
        if e.seconds is not None:
            message = f"The audio is {e.seconds:.1f} s long; this server takes up to {max_seconds:g} s."
        raise ApiError(
            413,
            message,
            param="file",
            code="audio_too_long",
        ) from None
    except AudioError as e:  # the reason names no path
        raise invalid(f"Cannot read the audio: {e.reason}.", "file", "invalid_audio") from None
    try:
        with engine.client():
            segments, info = transcribe(samples, pair, job.options, source_rate=SAMPLE_RATE, engine=engine)
            done = []
            try:
                for segment in segments:
                    done.append(segment)
                    if stop.is_set() or time.monotonic() > deadline:
                        raise timed_out(settings.request_timeout)
            finally:
                segments.close()
    except EngineClosed:
        raise shutting_down() from None
    return response(job, done, info)


def response(
    request: TranscriptionRequest, segments: Sequence[Segment], info: TranscriptionInfo
) -> tuple[Any, str]:
    """(body, media type): a dict for the JSON formats, text for the others."""
    fmt = request.response_format
    text = "".join(s.text for s in segments).strip()
    if fmt == "json":
        return {"text": text}, "application/json"
    if fmt == "text":
        return text + "\n", "text/plain; charset=utf-8"
    if fmt in ("srt", "vtt"):
        media = "text/vtt; charset=utf-8" if fmt == "vtt" else "text/plain; charset=utf-8"
        return render(fmt, segments, info, None, request.subtitles), media
    return finite(verbose(request, segments, info, text)), "application/json"


def verbose(
    request: TranscriptionRequest, segments: Sequence[Segment], info: TranscriptionInfo, text: str
) -> dict:
    """OpenAI's verbose_json, with specasr's speculation statistics and rendered outputs."""
    stats = info.stats
    body: dict[str, Any] = {
        "task": request.task,
        "language": LANGUAGE_NAMES.get(info.language, info.language),
        "duration": round(info.duration, 3),
        "text": text,
        "segments": [
            {
                "id": s.id,
                "seek": s.seek,
                "start": round(s.start, 3),
                "end": round(s.end, 3),
                "text": s.text,
                "tokens": s.tokens,
                "temperature": s.temperature,
                "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio,
                "no_speech_prob": s.no_speech_prob,
            }
            for s in segments
        ],
    }
    if request.words:  # OpenAI's words carry no leading space
        body["words"] = [
            {"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
            for s in segments
            for w in s.words or []
        ]
    body["speculation"] = {
        "mode": info.options.decode.mode,
        "draft": info.draft,
        "token_acceptance": stats.token_acceptance,
        "acceptance_rate": stats.acceptance_rate,
        "tokens_per_target_call": stats.tokens_per_target_call,
        "proposed": stats.proposed,
        "accepted": stats.accepted,
        "target_calls": stats.target_calls,
        "draft_calls": stats.draft_calls,
        "stats": stats.to_dict(),
    }
    if request.outputs:
        body["outputs"] = {
            fmt: render(fmt, segments, info, None, request.subtitles) for fmt in request.outputs
        }
    return body


def finite(value: Any) -> Any:
    """`value` with every non-finite float as None: JSON has no inf or NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
