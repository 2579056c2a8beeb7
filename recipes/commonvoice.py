"""Common Voice 16 English test split: test.tsv plus clips/*.mp3.

Common Voice needs an account and accepting its terms, so it cannot be fetched here;
`download` raises with the steps.
"""

from __future__ import annotations

import csv
from pathlib import Path

from specasr.recipes.base import DatasetError, DownloadError, Recipe, Utterance, find_dir

INSTRUCTIONS = """Common Voice cannot be downloaded automatically: it needs an account.
  1. sign in at https://commonvoice.mozilla.org/datasets and accept the terms;
  2. download the English dataset of Common Voice Corpus 16 (cv-corpus-16.*-en.tar.gz);
  3. unpack it, e.g. tar xzf cv-corpus-16.1-2023-12-06-en.tar.gz;
  4. pass the language directory that holds test.tsv and clips/ with --data-dir, e.g.
     specasr eval cv16-en --data-dir cv-corpus-16.1-2023-12-06/en"""


def load(data_dir: Path) -> list[Utterance]:
    root = Path(data_dir)
    if not (root / "test.tsv").is_file():
        root = find_dir(root, ["en"])
    tsv = root / "test.tsv"
    if not tsv.is_file():
        raise DatasetError(f"no test.tsv under {data_dir}.\n{INSTRUCTIONS}")
    utts = []
    with open(tsv, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            clip = row.get("path")
            if not clip or row.get("sentence") is None:
                raise DatasetError(f"{tsv}: expected columns `path` and `sentence`")
            utts.append(Utterance(Path(clip).stem, str(root / "clips" / clip), row["sentence"]))
    return sorted(utts, key=lambda u: u.id)


def download(cache_dir: Path) -> Path:
    raise DownloadError(INSTRUCTIONS)


RECIPES = {
    "cv16-en": Recipe("cv16-en", "Common Voice 16 English test (test.tsv + clips/*.mp3)", load, download)
}
