"""TED-LIUM release 3: stm/<talk>.stm and sph/<talk>.sph (NIST SPHERE, read by libsndfile).

An stm line is `talk channel speaker start end <label> transcript`; each line is one
utterance cut from the talk's sph by its start and end. Segments whose transcript is
`ignore_time_segment_in_scoring` are dropped. --data-dir may be the directory holding
stm/ and sph/ (e.g. TEDLIUM_release-3/legacy/test) or the release's root.
"""

from __future__ import annotations

from pathlib import Path

from specasr.recipes.base import DatasetError, Recipe, Utterance, fetch, find_dir

URL = "https://www.openslr.org/resources/51/TEDLIUM_release-3.tgz"
IGNORE = "ignore_time_segment_in_scoring"


def clean(text: str) -> str:
    """TED-LIUM writes contractions split ("it 's") and unknown words as <unk>."""
    words = [w for w in text.split() if w != "<unk>"]
    return " ".join(words).replace(" '", "'")


def parse_stm(stm: Path, sph_dir: Path) -> list[Utterance]:
    utts = []
    for n, line in enumerate(stm.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith(";;"):
            continue
        fields = line.split(maxsplit=6)
        if len(fields) < 5:
            raise DatasetError(f"{stm}:{n}: expected `talk channel speaker start end [<label>] text`")
        try:
            talk, start, end = fields[0], float(fields[3]), float(fields[4])
        except ValueError:
            raise DatasetError(
                f"{stm}:{n}: start and end must be seconds, got {fields[3]!r} {fields[4]!r}"
            ) from None
        rest = fields[5:]
        if rest and rest[0].startswith("<"):  # the optional <o,f0,gender> label
            rest = rest[1:]
        text = " ".join(rest)
        if text.strip() == IGNORE:
            continue
        audio = sph_dir / f"{talk}.sph"
        utts.append(
            Utterance(
                f"{talk}-{round(start * 100):07d}-{round(end * 100):07d}", str(audio), clean(text), start, end
            )
        )
    return utts


def load(data_dir: Path) -> list[Utterance]:
    root = find_dir(Path(data_dir), ["legacy/test", "TEDLIUM_release-3/legacy/test"])
    if not (root / "stm").is_dir() or not (root / "sph").is_dir():
        raise DatasetError(f"expected stm/ and sph/ under {root} (TED-LIUM 3)")
    utts = []
    for stm in sorted((root / "stm").glob("*.stm")):
        utts += parse_stm(stm, root / "sph")
    missing = sorted({u.audio_path for u in utts if not Path(u.audio_path).is_file()})
    if missing:
        raise DatasetError(f"stm files refer to missing audio: {', '.join(missing[:3])}")
    if not utts:
        raise DatasetError(f"no utterances in {root / 'stm'}")
    return sorted(utts, key=lambda u: u.id)


def download(cache_dir: Path) -> Path:
    # the whole release (~50 GB); its legacy/test split is what the paper evaluates
    return fetch(URL, Path(cache_dir), Path(cache_dir) / "TEDLIUM_release-3")


RECIPES = {"tedlium3": Recipe("tedlium3", "TED-LIUM 3 test (stm + sph), from openslr.org", load, download)}
