"""Issue 23, items 1 and 7: audio that expands far beyond its file size is refused from its
header, files decode in blocks (memory near the 16 kHz mono output), the ffmpeg fallback stops
at the limit, and float input far above full scale is scaled down with a warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import soundfile as sf
import soxr

from specasr.audio import LOUD_PEAK, AudioError, AudioTooLong, AudioWarning, load_audio
from specasr.constants import SAMPLE_RATE

MB = 2**20


def _write_silence(path, rate: int, channels: int, seconds: int, fmt: str = "FLAC") -> None:
    """A long file of silence, written ten seconds at a time."""
    with sf.SoundFile(path, "w", rate, channels, format=fmt, subtype="PCM_16") as f:
        block = np.zeros((rate * 10, channels), np.int16)
        for _ in range(seconds // 10):
            f.write(block)


@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    """The issue's file: 465 KiB of FLAC that decodes to 300 s of 192 kHz 8-channel audio
    (1.8 GB as float32; the whole-file decode used to raise memory by 2 GB)."""
    path = tmp_path_factory.mktemp("bomb") / "silence.flac"
    _write_silence(path, 192_000, 8, 300)
    assert path.stat().st_size < 1 * MB
    info = sf.info(path)
    assert (info.frames, info.samplerate, info.channels) == (300 * 192_000, 192_000, 8)
    return path


# Runs in a fresh interpreter: the peak resident set (ru_maxrss) before and after one call.
_MEASURE = """
import json, resource, sys
from specasr.apps.service import AppOptions, InputError, load_input
from specasr.audio import load_audio

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

path, how = sys.argv[1], sys.argv[2]
idle = peak_mb()
outcome = None
try:
    if how == "app":
        load_input(path, AppOptions(max_upload_mb=1, max_seconds=10))
    else:
        outcome = len(load_audio(path))
except InputError as e:
    outcome = str(e)
print(json.dumps({"idle_mb": idle, "peak_mb": peak_mb(), "outcome": outcome}))
"""


def _measure(path, how: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path), how], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    result["rise_mb"] = result["peak_mb"] - result["idle_mb"]
    print(how, result)
    return result


def test_decompression_bomb_is_refused_from_its_header_in_little_memory(bomb):
    result = _measure(bomb, "app")
    assert result["outcome"] == "The audio is 300.0 s long; this app takes up to 10 s."
    assert result["rise_mb"] < 300, result  # was about 2,000 MB: the whole file decoded first


@pytest.mark.parametrize("fmt", ["FLAC", "WAV"])
def test_without_a_limit_memory_stays_near_the_mono_16k_output(bomb, tmp_path, fmt):
    """`specasr transcribe` sets no limit: block decoding keeps memory near the 16 kHz mono
    size (300 s: 18 MiB), not the 1.8 GB of the decoded 8-channel file."""
    path = bomb
    if fmt == "WAV":  # uncompressed: 60 s of 8 channels at 192 kHz, 184 MB on disk
        path = tmp_path / "silence.wav"
        _write_silence(path, 192_000, 8, 60, "WAV")
    seconds = sf.info(path).duration
    result = _measure(path, "library")
    assert result["outcome"] == round(seconds * SAMPLE_RATE)
    output_mb = seconds * SAMPLE_RATE * 4 / MB
    assert result["rise_mb"] < 3 * output_mb + 40, (result, output_mb)


def _whole_file(path) -> np.ndarray:
    """The loader before block decoding: everything decoded, then downmixed and resampled."""
    frames, rate = sf.read(path, dtype="float32", always_2d=True)
    mono = frames.mean(axis=1, dtype=np.float32)
    return soxr.resample(mono, rate, SAMPLE_RATE, quality="VHQ").astype(np.float32)


@pytest.mark.parametrize("rate, channels", [(96_000, 6), (44_100, 2), (192_000, 8)])
def test_block_decoding_matches_the_whole_file_decode(librivox, tmp_path, rate, channels):
    """A long multi-channel high-rate file: the blocks give the old samples, within the
    resampler's tolerance (the streaming and one-shot soxr paths differ by rounding)."""
    speech = np.resize(np.concatenate([load_audio(c.path) for c in librivox]), 40 * SAMPLE_RATE)
    up = soxr.resample(speech, SAMPLE_RATE, rate, quality="VHQ")
    gains = np.linspace(1.0, 0.3, channels, dtype=np.float32)
    rng = np.random.default_rng(0)
    frames = up[:, None] * gains + 0.01 * rng.standard_normal((len(up), channels)).astype(np.float32)
    path = tmp_path / "long.flac"
    sf.write(path, np.clip(frames, -1, 1), rate, subtype="PCM_24")
    new, old = load_audio(path), _whole_file(path)
    assert len(new) == len(old) and abs(len(new) - len(speech)) <= 1
    assert len(new) == 40 * SAMPLE_RATE  # 40 s: many blocks of BLOCK_FRAMES
    assert np.abs(new - old).max() < 1e-4, np.abs(new - old).max()
    assert np.corrcoef(new, old)[0, 1] > 0.99999
    assert len(load_audio(path, max_seconds=45)) == len(new)  # under the limit: the same


def test_max_seconds_for_paths_bytes_and_arrays(librivox):
    clip = next(c for c in librivox if c.id.endswith("0870"))  # 7.1 s
    for source, kwargs in [
        (clip.path, {}),
        (clip.path.read_bytes(), {}),
        (np.zeros(71_000, np.float32), {"source_rate": 10_000}),
    ]:
        with pytest.raises(AudioTooLong, match=r"the audio is 7\.1 s long; the limit is 5 s") as info:
            load_audio(source, max_seconds=5, **kwargs)
        assert isinstance(info.value, AudioError) and info.value.seconds == pytest.approx(7.1)
        assert len(load_audio(source, max_seconds=8, **kwargs)) == 113_600
    with pytest.raises(ValueError, match="max_seconds must be > 0"):
        load_audio(clip.path, max_seconds=0)


def _fake_ffmpeg(tmp_path, monkeypatch, body: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "ffmpeg"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


def test_ffmpeg_output_without_end_stops_at_the_limit(tmp_path, monkeypatch):
    """A container with no stated length goes to ffmpeg; its output is read in blocks and
    the decoder is stopped at the limit (here it would never end: /dev/zero)."""
    _fake_ffmpeg(tmp_path, monkeypatch, "exec cat /dev/zero")
    path = tmp_path / "endless.mka"
    path.write_bytes(b"\x1aE\xdf\xa3 not for libsndfile" * 8)
    with pytest.raises(AudioTooLong, match="longer than 60 s") as info:
        load_audio(path, max_seconds=60)
    assert info.value.seconds is None
    with pytest.raises(AudioTooLong, match="longer than 60 s"):
        load_audio(path.read_bytes(), max_seconds=60)  # through ffmpeg's stdin


def test_ffmpeg_failure_is_named_with_its_message(tmp_path, monkeypatch):
    _fake_ffmpeg(tmp_path, monkeypatch, "echo 'Invalid data found when processing input' >&2; exit 1")
    path = tmp_path / "bad.mka"
    path.write_bytes(b"\x00junk" * 100)
    with pytest.raises(AudioError, match="ffmpeg could not decode it: Invalid data found"):
        load_audio(path, max_seconds=10)


def test_float_input_far_above_full_scale_is_scaled_with_a_warning(librivox, tmp_path):
    """Issue 23 item 7: a float wav peaking at 300 (int16 values stored as float, say) was
    transcribed as garbage without a word. Decision: above LOUD_PEAK (4.0) it is scaled to a
    peak of 1.0 with an AudioWarning; up to 4.0 (mild clipping) it is left alone."""
    clip = next(c for c in librivox if c.id.endswith("0880"))
    speech = load_audio(clip.path)
    loud = tmp_path / "loud.wav"
    sf.write(loud, speech * 32768, SAMPLE_RATE, subtype="FLOAT")
    with pytest.warns(
        AudioWarning, match=r"peak at 9\.\d+e\+03, far outside \[-1, 1\]; scaled to a peak of 1\.0"
    ):
        x = load_audio(loud)
    np.testing.assert_allclose(x, speech / np.abs(speech).max(), atol=1e-6)
    with pytest.warns(AudioWarning):
        load_audio(speech * 1000, source_rate=SAMPLE_RATE)
    mild = tmp_path / "mild.wav"
    sf.write(mild, speech * (LOUD_PEAK * 0.9 / np.abs(speech).max()), SAMPLE_RATE, subtype="FLOAT")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = load_audio(mild)  # no warning
        load_audio(clip.path)
    assert np.abs(y).max() == pytest.approx(LOUD_PEAK * 0.9, rel=1e-5)
