"""Audio loading: any file, bytes or array -> float32 mono at 16 kHz.

libsndfile (via soundfile) decodes wav, flac, ogg and mp3; anything else falls back to an
``ffmpeg`` subprocess when the binary is on PATH. Every failure is an ``AudioError``.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from specasr.constants import SAMPLE_RATE

MAX_CHANNELS = 8  # the short axis of a 2-D array must be at most this to count as channels

AudioSource = str | os.PathLike | bytes | bytearray | np.ndarray


class AudioError(Exception):
    """Audio that cannot be loaded; ``source`` is the path, ``"<bytes>"`` or ``"<array>"``."""

    def __init__(self, source: str, reason: str):
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


def load_audio(source: AudioSource, sr: int = SAMPLE_RATE, *, source_rate: int | None = None) -> np.ndarray:
    """Load audio as a float32 mono waveform at ``sr`` Hz.

    source: a file path, the encoded bytes of a file, or a decoded array of shape
        [frames], [frames, channels] or [channels, frames] (channels <= 8).
    source_rate: sample rate of an array source (required for arrays, ignored otherwise).
    Returns: np.ndarray float32, shape = (n_samples,). Channels are averaged, and the
        signal is resampled with soxr (VHQ) when its rate differs from ``sr``.
    """
    if isinstance(source, np.ndarray):
        name = "<array>"
        if source_rate is None:
            raise AudioError(name, "source_rate is required for array input")
        frames, rate = _array_frames(source, name), source_rate
    elif isinstance(source, (bytes, bytearray)):
        name = "<bytes>"
        if not source:
            raise AudioError(name, "no data (0 bytes)")
        data = bytes(source)
        frames, rate = _decode(io.BytesIO(data), name, "data", sr, ffmpeg_stdin=data)
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        name = str(path)
        if not path.exists():
            raise AudioError(name, "file not found")
        if path.is_dir():
            raise AudioError(name, "is a directory, not an audio file")
        if path.stat().st_size == 0:
            raise AudioError(name, "file is empty (0 bytes)")
        kind = f"{path.suffix} file" if path.suffix else "file"
        frames, rate = _decode(path, name, kind, sr)
    else:
        raise AudioError(f"<{type(source).__name__}>", "expected a path, bytes or numpy array")

    if frames.shape[0] == 0:
        raise AudioError(name, "contains no audio frames (zero length)")
    if rate <= 0:
        raise AudioError(name, f"invalid sample rate {rate}")
    mono = frames.mean(axis=1, dtype=np.float32)  # [frames]
    if not np.isfinite(mono).all():
        raise AudioError(name, "contains NaN or infinite samples")
    if rate != sr:
        mono = soxr.resample(mono, rate, sr, quality="VHQ")
    return np.ascontiguousarray(mono, dtype=np.float32)


def _array_frames(x: np.ndarray, name: str) -> np.ndarray:
    """Array -> float32 [frames, channels]; signed ints are scaled to [-1, 1)."""
    if np.issubdtype(x.dtype, np.signedinteger):
        x = x.astype(np.float32) / float(2 ** (8 * x.dtype.itemsize - 1))
    elif np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32, copy=False)
    else:
        raise AudioError(name, f"unsupported dtype {x.dtype}; expected float or signed int")
    if x.ndim == 1:
        return x[:, None]
    if x.ndim != 2:
        raise AudioError(name, f"expected a 1-D or 2-D array, got shape {x.shape}")
    n0, n1 = x.shape
    if n1 <= MAX_CHANNELS and n0 > n1:
        return x
    if n0 <= MAX_CHANNELS and n1 > n0:
        return x.T
    raise AudioError(
        name, f"cannot tell frames from channels in shape {x.shape}; expected [frames, channels]"
    )


def _decode(
    file: Path | io.BytesIO, name: str, kind: str, sr: int, ffmpeg_stdin: bytes | None = None
) -> tuple[np.ndarray, int]:
    """Decode with libsndfile, else ffmpeg. Returns ([frames, channels] float32, rate)."""
    try:
        frames, rate = sf.read(file, dtype="float32", always_2d=True)
        return frames, rate
    except sf.SoundFileError as err:
        sf_reason = getattr(err, "error_string", None) or str(err)
    if shutil.which("ffmpeg") is None:
        raise AudioError(
            name,
            f"cannot decode {kind} with libsndfile ({sf_reason}); install ffmpeg to read other containers",
        )
    return _ffmpeg_decode(file, name, sr, ffmpeg_stdin)[:, None], sr


def _ffmpeg_decode(file: Path | io.BytesIO, name: str, sr: int, stdin: bytes | None) -> np.ndarray:
    """ffmpeg decodes, downmixes and resamples to float32 mono at ``sr``: shape (n_samples,)."""
    src = "pipe:0" if stdin is not None else str(file)
    cmd = ["ffmpeg", "-nostdin", "-v", "error", "-i", src, "-f", "f32le", "-ac", "1"]
    cmd += ["-ar", str(sr), "-"]
    proc = subprocess.run(cmd, input=stdin, capture_output=True, check=False)
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        detail = lines[-1] if lines else f"exit status {proc.returncode}"
        raise AudioError(name, f"ffmpeg could not decode it: {detail}")
    return np.frombuffer(proc.stdout, dtype="<f4").astype(np.float32)
