"""A generic manifest: a jsonl or csv file with one utterance per row.

Columns: `audio` (path, relative to the manifest's directory or absolute), `text`, and
optionally `id` (default: the row number), `offset` and `duration`, or `start` and `end`,
in seconds. --data-dir is the manifest file.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from specasr.recipes.base import DatasetError, Recipe, Utterance


def _float(row: dict, key: str) -> float | None:
    value = row.get(key)
    return None if value in (None, "") else float(value)


def _utterance(row: dict, index: int, base: Path, where: str) -> Utterance:
    audio, text = row.get("audio"), row.get("text")
    if not audio or text is None:
        raise DatasetError(f"{where}: a row needs `audio` and `text`")
    start, end = _float(row, "start"), _float(row, "end")
    offset, duration = _float(row, "offset"), _float(row, "duration")
    if offset is not None or duration is not None:
        start = offset or 0.0
        end = None if duration is None else start + duration
    path = Path(audio) if Path(audio).is_absolute() else base / audio
    return Utterance(str(row.get("id") or f"{index:06d}"), str(path), str(text), start, end)


def load(manifest: Path) -> list[Utterance]:
    manifest = Path(manifest)
    if not manifest.is_file():
        raise DatasetError(f"manifest {manifest} is not a file (give it with --data-dir)")
    base = manifest.parent
    if manifest.suffix == ".csv":
        with open(manifest, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
    else:
        lines = manifest.read_text(encoding="utf-8").splitlines()
        try:
            rows = [json.loads(line) for line in lines if line.strip()]
        except json.JSONDecodeError as e:
            raise DatasetError(f"{manifest}: not jsonl ({e}); use .csv for a csv manifest") from e
    utts = [_utterance(r, i, base, f"{manifest}:{i + 1}") for i, r in enumerate(rows)]
    if len({u.id for u in utts}) != len(utts):
        raise DatasetError(f"{manifest}: ids are not unique")
    return sorted(utts, key=lambda u: u.id)


RECIPES = {"manifest": Recipe("manifest", "jsonl or csv manifest (audio, text, optional offsets)", load)}
