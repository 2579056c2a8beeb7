"""A generic manifest: a jsonl or csv file with one utterance per row.

Columns: `audio` (path, relative to the manifest's directory or absolute), `text`, and
optionally `id` (default: the row number), `offset` and `duration`, or `start` and `end`,
in seconds. --data-dir is the manifest file.

A manifest is the dataset's definition, so a malformed one is refused as a whole before
anything is decoded: `DatasetError` names the file and the line (`specasr eval` exits 2).
An audio file that is missing, corrupt or shorter than its row's span is a per-utterance
failure instead: it is recorded and the run goes on.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from specasr.recipes.base import DatasetError, Recipe, Utterance


def _float(row: dict, key: str, where: str) -> float | None:
    """Seconds in column `key`: None when absent or empty; a finite number >= 0 otherwise."""
    value = row.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        seconds = float(value)
    except ValueError:
        raise DatasetError(f"{where}: `{key}` must be a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise DatasetError(f"{where}: `{key}` must be a finite number of seconds >= 0, got {value!r}")
    return seconds


def _utterance(row: dict, index: int, base: Path, where: str) -> Utterance:
    audio, text = row.get("audio"), row.get("text")
    if not audio or text is None:
        raise DatasetError(f"{where}: a row needs `audio` and `text`")
    if not isinstance(audio, str) or not isinstance(text, str):
        raise DatasetError(f"{where}: `audio` and `text` must be strings")
    start, end = _float(row, "start", where), _float(row, "end", where)
    offset, duration = _float(row, "offset", where), _float(row, "duration", where)
    if offset is not None or duration is not None:
        start = offset or 0.0
        end = None if duration is None else start + duration
    if end is not None and end <= (start or 0.0):
        raise DatasetError(f"{where}: the span ends at {end:g} s, not after its start ({start or 0.0:g} s)")
    uid = row.get("id")
    if uid is not None and (isinstance(uid, bool) or not isinstance(uid, (str, int))):
        raise DatasetError(f"{where}: `id` must be a string, got {uid!r}")
    path = Path(audio) if Path(audio).is_absolute() else base / audio
    uid = f"{index:06d}" if uid is None or uid == "" else str(uid)  # an id 0 is "0", not the row
    return Utterance(uid, str(path), text, start, end)


def _jsonl_rows(manifest: Path, text: str) -> list[tuple[int, dict]]:
    """(line number, row) for every non-blank line; a line that is not a JSON object is refused."""
    rows = []
    for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines: JSON may hold U+2028
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(
                f"{manifest}:{lineno}: not valid JSON ({e.msg} at column {e.colno}); a jsonl manifest "
                "has one JSON object per line (name a csv manifest *.csv)"
            ) from None
        if not isinstance(row, dict):
            raise DatasetError(
                f"{manifest}:{lineno}: expected a JSON object with `audio` and `text`, "
                f"got {type(row).__name__} {line.strip()[:60]}"
            )
        rows.append((lineno, row))
    return rows


def _csv_rows(manifest: Path, text: str) -> list[tuple[int, dict]]:
    """(line number, row) for every csv record; the number is the line the record ends on."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = []
    try:
        for row in reader:
            if None in row:
                raise DatasetError(f"{manifest}:{reader.line_num}: more fields than the header has columns")
            rows.append((reader.line_num, row))
    except csv.Error as e:
        raise DatasetError(f"{manifest}:{reader.line_num}: not valid csv ({e})") from None
    return rows


def load(manifest: Path) -> list[Utterance]:
    manifest = Path(manifest)
    if not manifest.is_file():
        raise DatasetError(f"manifest {manifest} is not a file (give it with --data-dir)")
    try:
        text = manifest.read_bytes().decode("utf-8-sig")  # a BOM (spreadsheet exports) is dropped
    except UnicodeDecodeError as e:
        raise DatasetError(f"{manifest}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise DatasetError(f"cannot read manifest {manifest}: {e.strerror or e}") from None
    rows = _csv_rows(manifest, text) if manifest.suffix == ".csv" else _jsonl_rows(manifest, text)
    if not rows:
        raise DatasetError(f"{manifest}: no utterances (one row per utterance, with `audio` and `text`)")
    utts, lines = [], {}
    for i, (lineno, row) in enumerate(rows):
        u = _utterance(row, i, manifest.parent, f"{manifest}:{lineno}")
        if u.id in lines:
            raise DatasetError(f"{manifest}:{lineno}: id {u.id!r} is already on line {lines[u.id]}")
        lines[u.id] = lineno
        utts.append(u)
    return sorted(utts, key=lambda u: u.id)


RECIPES = {"manifest": Recipe("manifest", "jsonl or csv manifest (audio, text, optional offsets)", load)}
