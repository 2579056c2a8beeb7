"""Audio loading: any file, bytes or array -> float32 mono at 16 kHz.

libsndfile (via soundfile) decodes wav, flac, ogg and mp3; anything else falls back to an
``ffmpeg`` subprocess when the binary is on PATH. Every failure is an ``AudioError``.

Files are decoded in blocks: each block is downmixed to mono and resampled as it comes
(``soxr.ResampleStream``), so memory stays near the size of the float32 mono output whatever
the file's rate and channel count. With ``max_seconds`` the header's length is checked before
anything is decoded, and decoding stops at the cap for files whose header states no length
(ffmpeg's output is read in blocks too), so a small file that expands to hours of audio is
refused cheaply. Float input that peaks far above full scale (> ``LOUD_PEAK``) is scaled to a
peak of 1.0 with an ``AudioWarning``: Whisper's log-Mel features assume samples in [-1, 1].
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from specasr.constants import SAMPLE_RATE

MAX_CHANNELS = 8  # the short axis of a 2-D array must be at most this to count as channels
BLOCK_FRAMES = 1 << 16  # frames decoded at a time (8 channels of float32: 2 MiB)
LOUD_PEAK = 4.0  # float input peaking above this is normalised to a peak of 1.0, with a warning

AudioSource = str | os.PathLike | bytes | bytearray | np.ndarray


class AudioError(Exception):
    """Audio that cannot be loaded; ``source`` is the path, ``"<bytes>"`` or ``"<array>"``."""

    def __init__(self, source: str, reason: str):
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


class AudioTooLong(AudioError):
    """Audio longer than the ``max_seconds`` asked for; ``seconds`` is its length when the
    header states it, else None (decoding stopped at the limit)."""

    def __init__(self, source: str, seconds: float | None, max_seconds: float):
        self.seconds, self.max_seconds = seconds, max_seconds
        if seconds is None:
            reason = f"the audio is longer than {max_seconds:g} s (the limit); stopped decoding"
        else:
            reason = f"the audio is {seconds:.1f} s long; the limit is {max_seconds:g} s"
        super().__init__(source, reason)


class AudioWarning(UserWarning):
    """Audio that loads but was changed on the way (float input far above full scale)."""


def load_audio(
    source: AudioSource,
    sr: int = SAMPLE_RATE,
    *,
    source_rate: int | None = None,
    max_seconds: float | None = None,
) -> np.ndarray:
    """Load audio as a float32 mono waveform at ``sr`` Hz.

    source: a file path, the encoded bytes of a file, or a decoded array of shape
        [frames], [frames, channels] or [channels, frames] (channels <= 8).
    source_rate: sample rate of an array source (required for arrays, ignored otherwise).
    max_seconds: refuse (AudioError) audio longer than this; a file's header is checked
        before it is decoded, and decoding stops at the limit when the header has no length.
    Returns: np.ndarray float32, shape = (n_samples,). Channels are averaged, and the
        signal is resampled with soxr (VHQ) when its rate differs from ``sr``. Input that
        peaks above ``LOUD_PEAK`` is scaled to a peak of 1.0 (``AudioWarning``).
    """
    if max_seconds is not None and not max_seconds > 0:
        raise ValueError(f"max_seconds must be > 0, got {max_seconds}")
    if isinstance(source, np.ndarray):
        name = "<array>"
        if source_rate is None:
            raise AudioError(name, "source_rate is required for array input")
        frames = _array_frames(source, name)
        if frames.shape[0] == 0:
            raise AudioError(name, "contains no audio frames (zero length)")
        if source_rate <= 0:
            raise AudioError(name, f"invalid sample rate {source_rate}")
        _check_length(name, frames.shape[0] / source_rate, max_seconds)
        mono = _Mono(name, source_rate, sr)
        for start in range(0, frames.shape[0], BLOCK_FRAMES):
            mono.add(frames[start : start + BLOCK_FRAMES])
        return mono.finish()
    if isinstance(source, (bytes, bytearray)):
        name = "<bytes>"
        if not source:
            raise AudioError(name, "no data (0 bytes)")
        data = bytes(source)
        return _decode(io.BytesIO(data), name, "data", sr, max_seconds, ffmpeg_stdin=data)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        name = str(path)
        if not path.exists():
            raise AudioError(name, "file not found")
        if path.is_dir():
            raise AudioError(name, "is a directory, not an audio file")
        if path.stat().st_size == 0:
            raise AudioError(name, "file is empty (0 bytes)")
        kind = f"{path.suffix} file" if path.suffix else "file"
        return _decode(path, name, kind, sr, max_seconds)
    raise AudioError(f"<{type(source).__name__}>", "expected a path, bytes or numpy array")


def _check_length(name: str, seconds: float, max_seconds: float | None) -> None:
    if max_seconds is not None and seconds > max_seconds:
        raise AudioTooLong(name, seconds, max_seconds)


class _Mono:
    """Accumulates [frames, channels] float32 blocks as float32 mono at ``sr``: each block is
    downmixed and resampled as it comes, so nothing but the output grows."""

    def __init__(self, name: str, rate: int, sr: int, max_seconds: float | None = None):
        self.name, self.rate, self.sr, self.max_seconds = name, rate, sr, max_seconds
        self.stream = soxr.ResampleStream(rate, sr, 1, dtype="float32", quality="VHQ") if rate != sr else None
        self.chunks: list[np.ndarray] = []
        self.frames = 0  # input frames seen
        self.peak = 0.0  # largest |sample| of any channel

    def add(self, block: np.ndarray) -> None:
        if block.shape[0] == 0:
            return
        mono = block.mean(axis=1, dtype=np.float32)  # [frames]
        if not np.isfinite(mono).all():
            raise AudioError(self.name, "contains NaN or infinite samples")
        self.peak = max(self.peak, float(np.abs(block).max()))
        self.frames += block.shape[0]
        if self.max_seconds is not None:  # the header stated no length, or a wrong one
            seconds = self.frames / self.rate
            if seconds > self.max_seconds:
                raise AudioTooLong(self.name, None, self.max_seconds)
        self._keep(self.stream.resample_chunk(mono) if self.stream is not None else mono)

    def _keep(self, out: np.ndarray) -> None:
        if out.size:
            self.chunks.append(out)

    def finish(self) -> np.ndarray:
        if self.frames == 0:
            raise AudioError(self.name, "contains no audio frames (zero length)")
        if self.stream is not None:
            self._keep(self.stream.resample_chunk(np.zeros(0, np.float32), last=True))
        out = np.concatenate(self.chunks) if len(self.chunks) != 1 else self.chunks[0]
        self.chunks = []
        if self.peak > LOUD_PEAK:
            warnings.warn(
                f"{self.name}: float samples peak at {self.peak:.3g}, far outside [-1, 1]; "
                "scaled to a peak of 1.0 (Whisper expects full scale = 1.0)",
                AudioWarning,
                stacklevel=3,
            )
            out = out * np.float32(1.0 / np.abs(out).max()) if np.abs(out).max() > 0 else out
        return np.ascontiguousarray(out, dtype=np.float32)


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
    file: Path | io.BytesIO,
    name: str,
    kind: str,
    sr: int,
    max_seconds: float | None,
    ffmpeg_stdin: bytes | None = None,
) -> np.ndarray:
    """Decode with libsndfile in blocks, else ffmpeg; float32 mono at ``sr``."""
    try:  # a path as the file system's bytes: a name that is not UTF-8 opens as it is
        f = sf.SoundFile(os.fsencode(file) if isinstance(file, Path) else file)
    except sf.SoundFileError as err:
        sf_reason = getattr(err, "error_string", None) or str(err)
    else:
        with f:
            if f.samplerate <= 0:
                raise AudioError(name, f"invalid sample rate {f.samplerate}")
            # libsndfile reports a huge count when the header states no length
            known = 0 < f.frames < 2**62
            if known:
                _check_length(name, f.frames / f.samplerate, max_seconds)  # before decoding anything
            # a stated length is checked above; the cap stops a header that lies, or states none
            mono = _Mono(name, f.samplerate, sr, max_seconds)
            try:
                for block in f.blocks(BLOCK_FRAMES, dtype="float32", always_2d=True):
                    mono.add(block)
            except sf.SoundFileError as err:
                raise AudioError(name, f"cannot decode {kind}: {err}") from None
            return mono.finish()
    if shutil.which("ffmpeg") is None:
        raise AudioError(
            name,
            f"cannot decode {kind} with libsndfile ({sf_reason}); install ffmpeg to read other containers",
        )
    return _ffmpeg_decode(file, name, sr, ffmpeg_stdin, max_seconds)


def _ffmpeg_decode(
    file: Path | io.BytesIO, name: str, sr: int, stdin: bytes | None, max_seconds: float | None = None
) -> np.ndarray:
    """ffmpeg decodes, downmixes and resamples to float32 mono at ``sr``: shape (n_samples,).
    Its output is read in blocks; past ``max_seconds`` it is stopped and the audio refused."""
    src = "pipe:0" if stdin is not None else str(file)
    cmd = ["ffmpeg", "-nostdin", "-v", "error", "-i", src, "-f", "f32le", "-ac", "1"]
    cmd += ["-ar", str(sr), "-"]
    cap = None if max_seconds is None else int(max_seconds * sr) * 4  # bytes of output allowed
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
        )
        feeder = None
        if stdin is not None:
            feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True)
            feeder.start()
        chunks, size, over = [], 0, False
        try:
            while chunk := proc.stdout.read(1 << 20):
                chunks.append(chunk)
                size += len(chunk)
                if cap is not None and size > cap:
                    over = True
                    break
        finally:
            if over:
                proc.kill()
            proc.stdout.close()
            returncode = proc.wait()
            if feeder is not None:
                feeder.join(timeout=5)
        if over:
            raise AudioTooLong(name, None, max_seconds)
        if returncode != 0:
            err.seek(0)
            lines = err.read().decode(errors="replace").strip().splitlines()
            detail = lines[-1] if lines else f"exit status {returncode}"
            raise AudioError(name, f"ffmpeg could not decode it: {detail}")
    data = b"".join(chunks)
    del chunks
    samples = np.frombuffer(data[: len(data) // 4 * 4], dtype="<f4").astype(np.float32)
    if samples.size == 0:
        raise AudioError(name, "contains no audio frames (zero length)")
    mono = _Mono(name, sr, sr)
    mono.add(samples[:, None])
    return mono.finish()


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass
