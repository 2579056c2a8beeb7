"""What a dataset recipe yields: utterances (audio, reference text, optional time span).

A recipe reads one dataset's native layout from a directory and returns `Utterance`s sorted
by id. Where the dataset is freely downloadable, `download` fetches and unpacks it into a
cache directory; where it is not, it raises `DownloadError` saying what to do instead.
"""

from __future__ import annotations

import shutil
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class DownloadError(RuntimeError):
    """A dataset could not be fetched, or cannot be fetched automatically."""


class DatasetError(ValueError):
    """A data directory does not hold the layout a recipe expects."""


@dataclass(frozen=True)
class Utterance:
    id: str
    audio_path: str
    text: str  # reference transcript as the dataset writes it (normalised later, for WER)
    start: float | None = None  # seconds into the file; None = from the beginning
    end: float | None = None  # seconds into the file; None = to the end

    def load(self) -> np.ndarray:
        """The utterance's samples: float32 mono 16 kHz, shape = (n_samples,)."""
        from specasr.audio import AudioError, load_audio

        if self.start is None and self.end is None:
            return load_audio(self.audio_path)
        import soundfile as sf

        # seek within the file rather than decode a whole talk for every segment
        span = f"{self.start or 0.0:.2f}–{'end' if self.end is None else f'{self.end:.2f}'} s"
        try:
            info = sf.info(self.audio_path)
            start = round((self.start or 0.0) * info.samplerate)
            stop = None if self.end is None else round(self.end * info.samplerate)
            if start >= info.frames:  # sf.read would give no samples, which tell nothing
                length = f"{info.frames / info.samplerate:.2f} s"
                raise AudioError(
                    self.audio_path, f"the span {span} starts past the end of the audio ({length})"
                )
            frames, rate = sf.read(self.audio_path, start=start, stop=stop, dtype="float32", always_2d=True)
        except (sf.LibsndfileError, RuntimeError) as e:
            raise AudioError(self.audio_path, f"cannot read span {span}: {e}") from e
        if not len(frames):
            raise AudioError(self.audio_path, f"the span {span} holds no samples")
        return load_audio(frames, source_rate=rate)


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    load: Callable[[Path], list[Utterance]]  # data directory (or manifest file) -> utterances by id
    download: Callable[[Path], Path] | None = None  # cache directory -> data directory


def fetch(url: str, cache_dir: Path, unpacked: Path) -> Path:
    """Downloads the tar archive at `url` into `cache_dir` and unpacks it there, once.

    Returns `unpacked` (a path inside `cache_dir` that the archive creates); a path that is
    already there is returned without touching the network.
    """
    if unpacked.exists():
        return unpacked
    cache_dir.mkdir(parents=True, exist_ok=True)
    archive = cache_dir / url.rsplit("/", 1)[-1]
    if not archive.is_file():
        part = archive.with_name(archive.name + ".part")
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as out:
                shutil.copyfileobj(response, out, length=1 << 20)
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            part.unlink(missing_ok=True)
            raise DownloadError(
                f"cannot download {url}: {e}. Download and unpack it yourself into {cache_dir}, "
                "or pass the unpacked directory with --data-dir"
            ) from e
        part.rename(archive)
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(cache_dir, filter="data")
        else:  # Python < 3.12 without the backported filter
            tar.extractall(cache_dir)  # noqa: S202
    if not unpacked.exists():
        raise DownloadError(f"{archive} unpacked, but {unpacked} is not there")
    return unpacked


def find_dir(data_dir: Path, candidates: list[str]) -> Path:
    """The first of data_dir/<candidate> that exists, else data_dir itself."""
    for c in candidates:
        if (data_dir / c).is_dir():
            return data_dir / c
    return data_dir
