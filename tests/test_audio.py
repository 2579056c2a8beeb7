import os
import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf
import soxr

from specasr.audio import AudioError, load_audio
from specasr.constants import SAMPLE_RATE


@pytest.fixture(scope="module")
def clip(librivox):
    """The shortest fixture: (path, int16 samples)."""
    path = min((c.path for c in librivox), key=lambda p: sf.info(p).frames)
    pcm, rate = sf.read(path, dtype="int16")
    assert rate == SAMPLE_RATE
    return path, pcm


def corr(a: np.ndarray, b: np.ndarray) -> float:
    n = min(len(a), len(b))
    return float(np.corrcoef(a[:n], b[:n])[0, 1])


def test_fixtures_load_as_float32_mono(librivox):
    for c in librivox:
        x = load_audio(c.path)
        assert x.dtype == np.float32 and x.ndim == 1
        assert len(x) == sf.info(c.path).frames
        assert 0.01 < np.abs(x).max() <= 1.0


def test_int16_wav_scaled_to_unit_range(clip):
    path, pcm = clip
    np.testing.assert_array_equal(load_audio(path), pcm.astype(np.float32) / 32768)


@pytest.mark.parametrize("rate", [8000, 44100, 48000])
def test_stereo_at_other_rates_becomes_16k_mono(tmp_path, clip, rate):
    path, pcm = clip
    ref = pcm.astype(np.float32) / 32768
    y = soxr.resample(ref, SAMPLE_RATE, rate, quality="VHQ")
    stereo = np.stack([y, 0.8 * y], axis=1)  # [frames, 2]
    sf.write(tmp_path / "stereo.wav", stereo, rate, subtype="FLOAT")
    x = load_audio(tmp_path / "stereo.wav")
    assert x.dtype == np.float32 and x.ndim == 1
    assert abs(len(x) - len(ref)) <= 1
    c = corr(x, ref)
    print(f"{rate} Hz stereo -> 16 kHz: corr {c:.4f}")
    assert c > 0.95, f"correlation {c:.4f} at {rate} Hz"
    assert np.abs(x).max() == pytest.approx(0.9 * np.abs(ref).max(), rel=0.05)  # mean of 1, 0.8


@pytest.mark.parametrize("fmt", ["FLAC", "OGG", "MP3"])
def test_compressed_formats(tmp_path, clip, fmt):
    path, pcm = clip
    ref = pcm.astype(np.float32) / 32768
    out = tmp_path / f"clip.{fmt.lower()}"
    sf.write(out, ref, SAMPLE_RATE, format=fmt)
    x = load_audio(out)
    assert x.dtype == np.float32 and abs(len(x) - len(ref)) < 0.05 * SAMPLE_RATE
    if fmt == "FLAC":
        np.testing.assert_array_equal(x, ref)
    else:
        assert corr(x, ref) > 0.95


def test_bytes_input_matches_path(clip):
    path, _ = clip
    np.testing.assert_array_equal(load_audio(path.read_bytes()), load_audio(path))
    np.testing.assert_array_equal(load_audio(bytearray(path.read_bytes())), load_audio(path))


def test_array_input(clip):
    _, pcm = clip
    ref = pcm.astype(np.float32) / 32768
    np.testing.assert_array_equal(load_audio(pcm, source_rate=SAMPLE_RATE), ref)
    low = soxr.resample(ref, SAMPLE_RATE, 8000, quality="VHQ")
    stereo = np.stack([low, low], axis=1)  # [frames, 2]
    x = load_audio(stereo, source_rate=8000)
    assert abs(len(x) - len(ref)) <= 1 and corr(x, ref) > 0.95
    np.testing.assert_array_equal(load_audio(stereo.T, source_rate=8000), x)  # [2, frames]


def _missing(tmp):
    return tmp / "nope.wav", "not found"


def _directory(tmp):
    return tmp, "directory"


def _empty(tmp):
    (tmp / "empty.wav").write_bytes(b"")
    return tmp / "empty.wav", "empty"


def _zero_frames(tmp):
    sf.write(tmp / "zero.wav", np.zeros((0, 1), np.float32), SAMPLE_RATE)
    return tmp / "zero.wav", "no audio frames"


def _text_as_wav(tmp):
    (tmp / "notes.wav").write_text("this is not audio\n" * 20)
    return tmp / "notes.wav", "decode"


def _random_xyz(tmp):
    (tmp / "noise.xyz").write_bytes(np.random.default_rng(0).bytes(4096))
    return tmp / "noise.xyz", "decode"


@pytest.mark.parametrize("make", [_missing, _directory, _empty, _zero_frames, _text_as_wav, _random_xyz])
def test_bad_files(tmp_path, make):
    path, reason = make(tmp_path)
    with pytest.raises(AudioError, match=reason) as info:
        load_audio(path)
    assert info.value.source == str(path) and str(path) in str(info.value)
    assert reason in info.value.reason


@pytest.mark.parametrize(
    "source, kwargs, name, reason",
    [
        pytest.param(np.random.default_rng(0).bytes(2048), {}, "<bytes>", "decode", id="bytes-garbage"),
        pytest.param(b"", {}, "<bytes>", "0 bytes", id="bytes-empty"),
        pytest.param(
            np.array([0.1, np.nan, 0.2], np.float32),
            {"source_rate": 16000},
            "<array>",
            "NaN",
            id="array-nan",
        ),
        pytest.param(
            np.array([0.1, np.inf, 0.2], np.float32),
            {"source_rate": 16000},
            "<array>",
            "infinite",
            id="array-inf",
        ),
        pytest.param(np.zeros(1600, np.float32), {}, "<array>", "source_rate", id="array-no-rate"),
        pytest.param(
            np.zeros((2, 3, 1600), np.float32),
            {"source_rate": 16000},
            "<array>",
            "1-D or 2-D",
            id="array-3d",
        ),
        pytest.param(
            np.zeros((1600, 1600), np.float32),
            {"source_rate": 16000},
            "<array>",
            "channels",
            id="array-square",
        ),
        pytest.param(
            np.zeros(0, np.float32),
            {"source_rate": 16000},
            "<array>",
            "no audio frames",
            id="array-empty",
        ),
    ],
)
def test_bad_bytes_and_arrays(source, kwargs, name, reason):
    with pytest.raises(AudioError, match=reason) as info:
        load_audio(source, **kwargs)
    assert info.value.source == name and str(info.value).startswith(f"{name}: ")


def test_ffmpeg_missing_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    path = tmp_path / "clip.xyz"
    path.write_bytes(np.random.default_rng(1).bytes(4096))
    with pytest.raises(AudioError, match="install ffmpeg") as info:
        load_audio(path)
    assert str(path) in str(info.value) and ".xyz" in info.value.reason
    with pytest.raises(AudioError, match="install ffmpeg"):
        load_audio(path.read_bytes())


def _fake_ffmpeg(tmp_path, monkeypatch, body: str):
    """An `ffmpeg` on PATH that logs its arguments and runs `body` (sh) for its stdout."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "ffmpeg"
    script.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/ffmpeg-args\n{body}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "ffmpeg-args"


def test_ffmpeg_command_and_output(tmp_path, monkeypatch):
    """The fallback asks ffmpeg for f32le mono at the target rate and parses its stdout."""
    samples = np.linspace(-0.5, 0.5, 800, dtype=np.float32)
    (tmp_path / "out.f32").write_bytes(samples.astype("<f4").tobytes())
    args = _fake_ffmpeg(tmp_path, monkeypatch, f"cat {tmp_path}/out.f32")
    path = tmp_path / "clip.xyz"
    path.write_bytes(b"\x00not-a-sndfile-format" * 10)
    x = load_audio(path, sr=8000)
    np.testing.assert_array_equal(x, samples)
    cmd = args.read_text()
    assert f"-i {path}" in cmd and "-f f32le" in cmd and "-ac 1" in cmd and "-ar 8000" in cmd
    np.testing.assert_array_equal(load_audio(path.read_bytes(), sr=8000), samples)  # through stdin
    assert "-i pipe:0" in args.read_text()


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg binary not installed")
def test_ffmpeg_fallback_real(tmp_path, clip):
    path, pcm = clip
    mka = tmp_path / "clip.mka"  # Matroska: a container libsndfile cannot read
    cmd = ["ffmpeg", "-nostdin", "-v", "error", "-i", str(path), "-c:a", "pcm_s16le", str(mka)]
    subprocess.run(cmd, check=True)
    ref = pcm.astype(np.float32) / 32768
    np.testing.assert_array_equal(load_audio(mka), ref)
    np.testing.assert_array_equal(load_audio(mka.read_bytes()), ref)
    x = load_audio(mka, sr=8000)
    assert abs(len(x) - len(ref) // 2) <= 1
