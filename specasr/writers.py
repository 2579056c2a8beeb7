"""Transcript writers: txt, srt, vtt, tsv and json, written atomically.

Each renderer turns (segments, info) into text; `write` puts it in place through a temporary
file in the same directory and `os.replace`, so a reader never sees half a file and an
interrupted batch leaves no partial outputs behind.

The json document (JSON_SCHEMA below):
    {"text": str, "info": {...TranscriptionInfo.to_dict()}, "stats": {...DecodeStats.to_dict()},
     "segments": [{...Segment.to_dict()}, ...]}
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the CLI imports this module without loading torch
    from specasr.results import Segment, TranscriptionInfo

FORMATS = ("txt", "srt", "vtt", "tsv", "json")

_NUMBER = {"type": "number"}
JSON_SCHEMA = {
    "type": "object",
    "required": ["text", "info", "stats", "segments"],
    "properties": {
        "text": {"type": "string"},
        "info": {
            "type": "object",
            "required": ["language", "duration", "strategy", "mode", "model", "windows"],
            "properties": {
                "language": {"type": "string"},
                "duration": _NUMBER,
                "windows": {"type": "integer"},
            },
        },
        "stats": {
            "type": "object",
            "required": ["proposed", "accepted", "acceptance_rate", "target_calls", "encoder_s", "decoder_s"],
        },
        "segments": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "id",
                    "start",
                    "end",
                    "text",
                    "tokens",
                    "avg_logprob",
                    "compression_ratio",
                    "no_speech_prob",
                    "temperature",
                    "stats",
                ],
                "properties": {
                    "id": {"type": "integer"},
                    "start": _NUMBER,
                    "end": _NUMBER,
                    "text": {"type": "string"},
                    "tokens": {"type": "array", "items": {"type": "integer"}},
                    "temperature": _NUMBER,
                    "stats": {"type": "object", "required": ["proposed", "accepted", "acceptance_rate"]},
                },
            },
        },
    },
}


def _clock(seconds: float, decimal: str) -> str:
    """Seconds -> HH:MM:SS,mmm (srt) or HH:MM:SS.mmm (vtt)."""
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{decimal}{ms:03d}"


def _flat(text: str) -> str:
    """One line: newlines and tabs would break a txt line or a tsv row."""
    return " ".join(text.split())


def _line(text: str) -> str:
    # a blank line would end a subtitle cue early, and "-->" reads as cue timing
    return _flat(text).replace("-->", "->")


def render_txt(segments: Sequence[Segment], info: TranscriptionInfo) -> str:
    return "".join(_flat(s.text) + "\n" for s in segments)


def render_srt(segments: Sequence[Segment], info: TranscriptionInfo) -> str:
    cues = [
        f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{_line(s.text)}\n"
        for i, s in enumerate(segments, start=1)
    ]
    return "\n".join(cues)


def render_vtt(segments: Sequence[Segment], info: TranscriptionInfo) -> str:
    cues = [f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{_line(s.text)}\n" for s in segments]
    return "WEBVTT\n\n" + "\n".join(cues)


def render_tsv(segments: Sequence[Segment], info: TranscriptionInfo) -> str:
    """Whisper's tsv: start and end in integer milliseconds."""
    rows = [f"{round(s.start * 1000)}\t{round(s.end * 1000)}\t{_flat(s.text)}" for s in segments]
    return "start\tend\ttext\n" + "".join(r + "\n" for r in rows)


def render_json(segments: Sequence[Segment], info: TranscriptionInfo) -> str:
    doc = {
        "text": "".join(s.text for s in segments).strip(),
        "info": info.to_dict(),
        "stats": info.stats.to_dict(),
        "segments": [s.to_dict() for s in segments],
    }
    return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"


RENDERERS: dict[str, Callable[[Sequence[Segment], TranscriptionInfo], str]] = {
    "txt": render_txt,
    "srt": render_srt,
    "vtt": render_vtt,
    "tsv": render_tsv,
    "json": render_json,
}


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to `path` through a temporary file in the same directory and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def output_paths(stem: str, output_dir: str | os.PathLike, formats: Sequence[str]) -> dict[str, Path]:
    return {fmt: Path(output_dir) / f"{stem}.{fmt}" for fmt in formats}


def write(
    segments: Sequence[Segment],
    info: TranscriptionInfo,
    stem: str,
    output_dir: str | os.PathLike,
    formats: Sequence[str] = FORMATS,
) -> list[Path]:
    """Writes `<output_dir>/<stem>.<fmt>` for each format; returns the paths."""
    paths = output_paths(stem, output_dir, formats)
    for fmt, path in paths.items():
        write_atomic(path, RENDERERS[fmt](segments, info))
    return list(paths.values())
