"""LibriSpeech test sets: SPEAKER/CHAPTER/SPEAKER-CHAPTER-NNNN.flac plus SPEAKER-CHAPTER.trans.txt.

--data-dir may be the split directory itself (…/LibriSpeech/test-clean), the LibriSpeech
directory holding it, or the directory holding LibriSpeech/.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from specasr.recipes.base import DatasetError, Recipe, Utterance, fetch, find_dir

MIRROR = "https://www.openslr.org/resources/12"


def url(split: str) -> str:
    return f"{MIRROR}/{split}.tar.gz"


def load(split: str, data_dir: Path) -> list[Utterance]:
    root = find_dir(Path(data_dir), [f"LibriSpeech/{split}", split])
    utts = []
    for trans in sorted(root.rglob("*.trans.txt")):
        for line in trans.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            utt_id, _, text = line.strip().partition(" ")
            audio = trans.parent / f"{utt_id}.flac"
            if not audio.is_file():
                raise DatasetError(f"{trans} lists {utt_id}, but {audio} is missing")
            utts.append(Utterance(utt_id, str(audio), text))
    if not utts:
        raise DatasetError(f"no SPEAKER/CHAPTER/*.trans.txt under {root} (LibriSpeech {split})")
    return sorted(utts, key=lambda u: u.id)


def download(split: str, cache_dir: Path) -> Path:
    return fetch(url(split), Path(cache_dir), Path(cache_dir) / "LibriSpeech" / split)


RECIPES = {
    name: Recipe(
        name,
        f"LibriSpeech {split} (flac + trans.txt), downloadable from openslr.org",
        partial(load, split),
        partial(download, split),
    )
    for name, split in (("librispeech-clean", "test-clean"), ("librispeech-other", "test-other"))
}
