"""Transcript writers: txt, srt, vtt, tsv and json, written atomically.

Each renderer turns (segments, info) into text; `write` renders, and `write_rendered` puts
every format of one input in place at once, whether rendered here or by `specasr serve`:
each goes to a temporary file in the same directory first, then all are renamed
(`os.replace`), so a reader never sees half a file and a failure part-way leaves none of the
new files. Files get the usual mode (0666 less the umask). A temporary file is
named `.NAME.PID.XXXXXXXX.tmp`; `clean_stale_temps` removes those whose writer is gone.

With a `source` (`source_record(path)`: the input's absolute path, size and mtime), the json
document records it, and a hidden sidecar `.STEM.specasr.json` beside the outputs records,
per format, the source it was made from (`provenance`), so a later run can tell outputs of
the same input from those of another input with the same name. `output_lock` keeps two runs
from writing one output name at once.

The json document (JSON_SCHEMA below):
    {"text": str, "info": {...TranscriptionInfo.to_dict()}, "stats": {...DecodeStats.to_dict()},
     "segments": [{...Segment.to_dict()}, ...], "source": {"path", "size", "mtime_ns"} (optional)}

With word timestamps (`Segment.words`), json segments carry "words" ({"word", "start", "end",
"probability"}), tsv has one row per word (start, end, text, probability), and srt/vtt cues
follow `SubtitleOptions` as openai-whisper's writers do: lines of at most `max_line_width`
characters, cues of at most `max_line_count` lines (both given: words flow across segments,
and a pause over 3 s starts a new cue; otherwise each segment is a cue), and with
`highlight_words` one cue per word with that word underlined.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the CLI imports this module without loading torch
    from specasr.results import Segment, TranscriptionInfo, Word

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
        "source": {
            "type": "object",
            "required": ["path", "size", "mtime_ns"],
            "properties": {
                "path": {"type": "string"},
                "size": {"type": "integer"},
                "mtime_ns": {"type": "integer"},
            },
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
                    "words": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["word", "start", "end", "probability"],
                            "properties": {
                                "word": {"type": "string"},
                                "start": _NUMBER,
                                "end": _NUMBER,
                                "probability": _NUMBER,
                            },
                        },
                    },
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


def segment_line(start: float, end: float, text: str) -> str:
    """A segment as `--verbose` prints it (openai-whisper's form): [MM:SS.mmm --> MM:SS.mmm] text,
    hours shown once they are reached."""

    def clock(seconds: float) -> str:
        hms = _clock(seconds, ".")
        return hms[3:] if hms.startswith("00:") else hms

    return f"[{clock(start)} --> {clock(end)}] {_flat(text)}"


def _flat(text: str) -> str:
    """One line: newlines and tabs would break a txt line or a tsv row."""
    return " ".join(text.split())


def _line(text: str) -> str:
    # a blank line would end a subtitle cue early, and "-->" reads as cue timing
    return _flat(text).replace("-->", "->")


def render_txt(segments: Sequence[Segment], info: TranscriptionInfo) -> str:
    return "".join(_flat(s.text) + "\n" for s in segments)


@dataclass(frozen=True)
class SubtitleOptions:
    """How srt and vtt lay out word-timed segments (openai-whisper's CLI options)."""

    max_line_width: int | None = None  # characters per line before a line break
    max_line_count: int | None = None  # lines per cue; with max_line_width, words flow across segments
    highlight_words: bool = False  # one cue per word, the spoken word underlined (<u>word</u>)

    def __post_init__(self) -> None:
        for name in ("max_line_width", "max_line_count"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")


LONG_PAUSE = 3.0  # seconds between words that start a new cue when words flow across segments


def _word_lines(segments: Sequence[Segment], sub: SubtitleOptions) -> Iterator[list[Word]]:
    """Word-timed segments -> cues as lists of words, a word's text carrying its "\n" line
    break or leading space. Each segment is a cue unless both limits are given."""
    flow = sub.max_line_width is not None and sub.max_line_count is not None
    width = sub.max_line_width or 1000
    cue: list[Word] = []
    line_len, lines = 0, 1
    last = next((s.words[0].start for s in segments if s.words), 0.0)
    for seg in segments:
        for i, word in enumerate(seg.words or []):
            text = (" " if word.word[:1].isspace() else "") + _line(word.word)
            pause = flow and word.start - last > LONG_PAUSE
            new_segment = not flow and i == 0 and bool(cue)
            if line_len > 0 and line_len + len(text) <= width and not pause and not new_segment:
                line_len += len(text)
            else:
                text = text.strip()
                if cue and (new_segment or (flow and (pause or lines >= sub.max_line_count))):
                    yield cue
                    cue, lines = [], 1
                elif line_len > 0:
                    lines += 1
                    text = "\n" + text
                line_len = len(text.strip())
            cue.append(replace(word, word=text))
            last = word.start
    if cue:
        yield cue


def _cues(
    segments: Sequence[Segment], sub: SubtitleOptions | None, decimal: str
) -> list[tuple[str, str, str]]:
    """(start, end, text) of each cue: one per segment, or laid out from words (SubtitleOptions)."""
    if not any(s.words for s in segments):
        return [(_clock(s.start, decimal), _clock(s.end, decimal), _line(s.text)) for s in segments]
    sub = sub or SubtitleOptions()
    cues = []
    for words in _word_lines(segments, sub):
        start, end = _clock(words[0].start, decimal), _clock(words[-1].end, decimal)
        texts = [w.word for w in words]
        if not sub.highlight_words:
            cues.append((start, end, "".join(texts)))
            continue
        last = start
        for i, w in enumerate(words):
            a, b = _clock(w.start, decimal), _clock(w.end, decimal)
            if a != last:  # the gap before this word shows the cue plainly
                cues.append((last, a, "".join(texts)))
            marked = [re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", t) if j == i else t for j, t in enumerate(texts)]
            cues.append((a, b, "".join(marked)))
            last = b
    return cues


def render_srt(
    segments: Sequence[Segment], info: TranscriptionInfo, subtitles: SubtitleOptions | None = None
) -> str:
    cues = [
        f"{i}\n{a} --> {b}\n{text}\n"
        for i, (a, b, text) in enumerate(_cues(segments, subtitles, ","), start=1)
    ]
    return "\n".join(cues)


def render_vtt(
    segments: Sequence[Segment], info: TranscriptionInfo, subtitles: SubtitleOptions | None = None
) -> str:
    cues = [f"{a} --> {b}\n{text}\n" for a, b, text in _cues(segments, subtitles, ".")]
    return "WEBVTT\n\n" + "\n".join(cues)


def render_tsv(segments: Sequence[Segment], info: TranscriptionInfo) -> str:
    """Whisper's tsv: start and end in integer milliseconds; with words, one row per word
    and its probability."""
    if any(s.words for s in segments):
        rows = [
            f"{round(w.start * 1000)}\t{round(w.end * 1000)}\t{_flat(w.word)}\t{w.probability:.4f}"
            for s in segments
            for w in s.words or []
        ]
        return "start\tend\ttext\tprobability\n" + "".join(r + "\n" for r in rows)
    rows = [f"{round(s.start * 1000)}\t{round(s.end * 1000)}\t{_flat(s.text)}" for s in segments]
    return "start\tend\ttext\n" + "".join(r + "\n" for r in rows)


def render_json(segments: Sequence[Segment], info: TranscriptionInfo, source: dict | None = None) -> str:
    doc = {
        "text": "".join(s.text for s in segments).strip(),
        "info": info.to_dict(),
        "stats": info.stats.to_dict(),
        "segments": [s.to_dict() for s in segments],
    }
    return _dump_json(doc, source)


def _dump_json(doc: dict, source: dict | None) -> str:
    if source is not None:
        doc["source"] = source
    text = json.dumps(doc, ensure_ascii=False, indent=1) + "\n"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a file name that is not UTF-8 (its bytes kept as surrogates)
        text = json.dumps(doc, indent=1) + "\n"  # escaped: it reads back as the same name
    return text


def json_with_source(text: str, source: dict | None) -> str:
    """A json document `render_json` made without a source (a server's), as it would have
    made it with `source`: the same text with "source" as its last key."""
    return text if source is None else _dump_json(json.loads(text), source)


RENDERERS: dict[str, Callable[[Sequence[Segment], TranscriptionInfo], str]] = {
    "txt": render_txt,
    "srt": render_srt,
    "vtt": render_vtt,
    "tsv": render_tsv,
    "json": render_json,
}


def render(
    fmt: str,
    segments: Sequence[Segment],
    info: TranscriptionInfo,
    source: dict | None = None,
    subtitles: SubtitleOptions | None = None,
) -> str:
    """The text of one format; json records `source` when given; srt and vtt lay word-timed
    segments out by `subtitles`."""
    if fmt == "json":
        return render_json(segments, info, source)
    if fmt in ("srt", "vtt"):
        return RENDERERS[fmt](segments, info, subtitles)
    return RENDERERS[fmt](segments, info)


def source_record(path: str | os.PathLike) -> dict:
    """What identifies an input: its absolute path, size and modification time (ns)."""
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


# ---- writing ----------------------------------------------------------------------------
TEMP_AGE_S = 60.0  # a temporary file this old has no live writer, whatever its pid says
_TEMP = re.compile(r"^\.(?P<name>.+?)\.(?:(?P<pid>\d+)\.)?[a-z0-9_]{8}\.tmp$")
_OUR_SUFFIXES = tuple(f".{f}" for f in FORMATS)


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask would, for a moment, for every thread)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_temp(path: Path, text: str, mode: int) -> Path:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0600, and the mode survives the rename
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_files(texts: dict[Path, str]) -> None:
    """Writes every file to a temporary file in its directory first, then renames them all;
    if anything fails, the temporary files and the files already renamed are removed, so
    either all of the new files are in place or none is. The renames go in the given order."""
    mode = 0o666 & ~_umask()
    temps: dict[Path, Path] = {}
    renamed: list[Path] = []
    try:
        for path, text in texts.items():
            temps[path] = _write_temp(Path(path), text, mode)
        for path, tmp in temps.items():
            os.replace(tmp, path)
            renamed.append(path)
    except BaseException:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        for path in renamed:
            Path(path).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to `path` through a temporary file in the same directory and a rename."""
    write_files({Path(path): text})


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


def clean_stale_temps(directory: str | os.PathLike, min_age_s: float = 2.0) -> list[Path]:
    """Removes this module's temporary files in `directory` whose writer is gone: the pid in
    the name is no live process (and the file is over `min_age_s` old), or the file is over
    TEMP_AGE_S old. Other files are never touched. Returns the removed paths."""
    removed = []
    now = time.time()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        m = _TEMP.match(entry.name)
        if not m or not m["name"].endswith(_OUR_SUFFIXES) or not entry.is_file(follow_symlinks=False):
            continue
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        dead = m["pid"] is not None and not _pid_alive(int(m["pid"]))
        if age > TEMP_AGE_S or (dead and age > min_age_s):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def output_paths(stem: str, output_dir: str | os.PathLike, formats: Sequence[str]) -> dict[str, Path]:
    """`<output_dir>/<stem>.<fmt>` per format; `stem` may hold folders ("A/x")."""
    return {fmt: Path(output_dir) / f"{stem}.{fmt}" for fmt in formats}


def sidecar_path(stem: str, output_dir: str | os.PathLike) -> Path:
    """The hidden record of which source each format of `stem` was made from."""
    p = Path(output_dir) / stem
    return p.with_name(f".{p.name}.specasr.json")


def provenance(stem: str, output_dir: str | os.PathLike) -> dict[str, dict]:
    """Format -> {"source": source_record, "written_at": unix time} for `stem`'s outputs, from
    its sidecar; formats without a record are absent (e.g. outputs of an older version)."""
    try:
        doc = json.loads(sidecar_path(stem, output_dir).read_text(encoding="utf-8"))
        outputs = doc["outputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {k: v for k, v in outputs.items() if isinstance(v, dict) and isinstance(v.get("source"), dict)}


def write(
    segments: Sequence[Segment],
    info: TranscriptionInfo,
    stem: str,
    output_dir: str | os.PathLike,
    formats: Sequence[str] = FORMATS,
    source: dict | None = None,
    subtitles: SubtitleOptions | None = None,
) -> list[Path]:
    """Writes `<output_dir>/<stem>.<fmt>` for each format, all or none (`write_rendered`);
    returns the paths. With `source` (`source_record`), json records it."""
    texts = {fmt: render(fmt, segments, info, source, subtitles) for fmt in formats}
    return write_rendered(texts, stem, output_dir, source)


def write_rendered(
    texts: dict[str, str], stem: str, output_dir: str | os.PathLike, source: dict | None = None
) -> list[Path]:
    """Writes each format's text (format -> text, as `render` makes it, here or on a server)
    to `<output_dir>/<stem>.<fmt>`, all or none (`write_files`); returns the paths. With
    `source`, the sidecar (`provenance`) records it and is updated last, so a record never
    names outputs that are not in place."""
    paths = output_paths(stem, output_dir, list(texts))
    next(iter(paths.values()), Path(output_dir) / stem).parent.mkdir(parents=True, exist_ok=True)
    files: dict[Path, str] = {paths[fmt]: text for fmt, text in texts.items()}
    record = provenance(stem, output_dir)
    if source is not None or any(fmt in record for fmt in texts):
        written = {"source": source, "written_at": time.time(), "pid": os.getpid()}
        for fmt in texts:
            if source is None:
                record.pop(fmt, None)  # no longer made from what the record says
            else:
                record[fmt] = written
        files[sidecar_path(stem, output_dir)] = json.dumps({"outputs": record}, indent=1) + "\n"
    write_files(files)
    return list(paths.values())


# ---- one writer per output name ---------------------------------------------------------
class OutputBusyError(RuntimeError):
    """Another live process holds the lock on an output name."""


@contextlib.contextmanager
def output_lock(stem: str, output_dir: str | os.PathLike):
    """Holds `.STEM.lock` beside `stem`'s outputs (an flock, released by the kernel if the
    process dies, so a lock is never stale); raises OutputBusyError naming the holder when
    another process has it. Where flock is missing the lock is a no-op."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    p = Path(output_dir) / stem
    path = p.with_name(f".{p.name}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise OutputBusyError(
                f"{p} is being written by another specasr run (pid {holder}); not touched"
            ) from None
        try:  # the holder before us may have removed the file after we opened it: lock the new one
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)
