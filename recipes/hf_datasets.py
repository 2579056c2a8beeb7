"""Hugging Face `datasets` as an eval source (`specasr eval datasets`, extra `specasr[datasets]`).

--data-dir is a dataset saved with `save_to_disk` (a `Dataset` or a `DatasetDict`), a
parquet file or a directory of them (split names are read from the file names, as the hub
lays them out: `test-00000-of-00001.parquet`, `data/test/…`), or a hub id (downloaded by
`datasets`, where the hub is reachable).

The audio column may be an `Audio` feature, a struct with `array` and `sampling_rate`, a
struct with `bytes` and/or `path`, raw bytes, or a path string (relative paths are taken
from --data-dir). An `Audio` column is cast to `Audio(decode=False)`, so `datasets` never
decodes (recent versions would need torchcodec for that): specasr's own loader decodes the
bytes or the file. Each row's encoded audio is read into memory when the dataset is loaded,
so utterances can travel to Ray workers on other machines. `id` is the id column where
there is one, else the row number.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from specasr.recipes.base import DatasetError, Recipe

INSTALL = "pip install 'specasr[datasets]'"
_DISK_MARKERS = ("dataset_dict.json", "state.json", "dataset_info.json")


@dataclass(frozen=True)
class RowUtterance:
    """An utterance whose audio came from a dataset row: encoded bytes, an array with its
    rate, or a path."""

    id: str
    text: str
    audio: bytes | str | tuple[np.ndarray, int]  # bytes, a path, or (samples [n] or [n, ch], rate)
    start: float | None = None  # the recipes' Utterance fields a run reads: whole rows only
    end: float | None = None

    def load(self) -> np.ndarray:
        """The row's samples: float32 mono 16 kHz, shape = (n_samples,)."""
        from specasr.audio import load_audio

        if isinstance(self.audio, tuple):
            samples, rate = self.audio
            return load_audio(samples, source_rate=rate)
        return load_audio(self.audio)


def _pick_split(splits: dict, split: str | None, where: str):
    """The split asked for; without --split "test", or the only split there is."""
    want = split or "test"
    if want in splits:
        return splits[want]
    if split is None and len(splits) == 1:
        return next(iter(splits.values()))
    raise DatasetError(f"{where} has no split {want!r}; it has {', '.join(sorted(splits))} (--split)")


def _open(source: str, split: str | None):
    """A `datasets.Dataset` from a save_to_disk directory, parquet files or a hub id."""
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"the datasets source needs Hugging Face datasets: {INSTALL}") from None
    path = Path(source).expanduser()
    try:
        if path.is_dir() and any((path / m).is_file() for m in _DISK_MARKERS):
            ds = datasets.load_from_disk(str(path))
            return _pick_split(ds, split, str(path)) if isinstance(ds, datasets.DatasetDict) else ds
        if path.is_file() and path.suffix == ".parquet":
            return datasets.load_dataset("parquet", data_files=str(path), split="train")
        if path.is_dir():
            if not any(path.rglob("*.parquet")):
                raise DatasetError(f"{path} holds neither a save_to_disk dataset nor parquet files")
            return _pick_split(datasets.load_dataset(str(path)), split, str(path))
        if path.exists() or source.startswith((".", "/", "~")):
            raise DatasetError(f"{source}: not a dataset directory or a parquet file")
        return _pick_split(datasets.load_dataset(source), split, source)  # a hub id
    except DatasetError:
        raise
    except Exception as e:  # datasets raises many kinds (FileNotFoundError, hub errors …)
        raise DatasetError(f"cannot load the dataset {source}: {type(e).__name__}: {e}") from None


def _audio(value: Any, base: Path, where: str) -> bytes | str | tuple[np.ndarray, int]:
    """One cell of the audio column -> what `RowUtterance.audio` holds."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value if Path(value).is_absolute() else str(base / value)
    if isinstance(value, dict):
        if value.get("array") is not None:
            if not isinstance(value.get("sampling_rate"), int):
                raise DatasetError(f"{where}: an audio array needs an integer `sampling_rate`")
            return np.asarray(value["array"], dtype=np.float32), value["sampling_rate"]
        if value.get("bytes"):
            return bytes(value["bytes"])
        if value.get("path"):
            return _audio(value["path"], base, where)
    raise DatasetError(
        f"{where}: the audio is {type(value).__name__} {str(value)[:60]}; expected bytes, a path, "
        "or a dict with `array` and `sampling_rate`, or `bytes` or `path`"
    )


def load(
    data_dir: Path | str,
    audio_column: str = "audio",
    text_column: str = "text",
    split: str | None = None,
) -> list[RowUtterance]:
    """The dataset's rows as utterances, sorted by id; split None: "test", or the only one."""
    ds = _open(str(data_dir), split)
    missing = [c for c in (audio_column, text_column) if c not in ds.column_names]
    if missing:
        raise DatasetError(
            f"{data_dir}: no column {', '.join(missing)}; it has {', '.join(ds.column_names)} "
            "(name them with --audio-column and --text-column)"
        )
    import datasets

    if isinstance(ds.features[audio_column], datasets.Audio):
        ds = ds.cast_column(audio_column, datasets.Audio(decode=False))  # decoded by specasr.audio
    has_id = "id" in ds.column_names
    columns = [audio_column, text_column] + (["id"] if has_id else [])
    base = Path(data_dir).expanduser()
    base = base.parent if base.is_file() else base
    utts, seen = [], set()
    for i, row in enumerate(ds.select_columns(columns)):
        where = f"{data_dir}: row {i}"
        text = row[text_column]
        if not isinstance(text, str):
            raise DatasetError(f"{where}: the text is {type(text).__name__}, not a string")
        uid = f"{i:06d}" if not has_id or row["id"] in (None, "") else str(row["id"])
        if uid in seen:
            raise DatasetError(f"{where}: id {uid!r} is there twice")
        seen.add(uid)
        utts.append(RowUtterance(uid, text, _audio(row[audio_column], base, where)))
    if not utts:
        raise DatasetError(f"{data_dir}: the dataset has no rows")
    return sorted(utts, key=lambda u: u.id)


RECIPES = {
    "datasets": Recipe(
        "datasets", "Hugging Face datasets: save_to_disk, parquet or a hub id (audio and text columns)", load
    )
}
