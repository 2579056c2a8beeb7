"""Voice activity detection (issue 18, part 2): Silero VAD in plain torch, the speech-chunk
rules, the time map back to the recording, and `--vad` end to end on the long-form fixture."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
import torch
from click.testing import CliRunner

from benchmarks.longform import LongRecording, long_recording
from specasr.eval.metric import wer
from specasr.longform.spans import SpanMap
from specasr.longform.vad import CHUNK, detect_speech, speech_chunks, speech_probabilities
from specasr.options import TranscribeOptions, VadOptions
from specasr.results import Segment
from specasr.transcription import transcribe

SR = 16000
CPS = SR / CHUNK  # probabilities per second (31.25)


@pytest.fixture(scope="module")
def long_audio(librivox) -> LongRecording:
    return long_recording(librivox[0].path.parent)


@pytest.fixture(scope="module")
def quiet_files() -> dict[str, np.ndarray]:
    """20 s of digital silence, and 20 s of white noise at -26 dBFS."""
    rng = np.random.default_rng(0)
    return {
        "silence": np.zeros(20 * SR, np.float32),
        "noise": (0.05 * rng.standard_normal(20 * SR)).astype(np.float32),
    }


# ---- the network -------------------------------------------------------------------------------
@pytest.mark.slow  # the package's TorchScript model, one 32 ms chunk per call
def test_matches_the_packaged_torchscript_model(librivox):
    from specasr.longform.vad import weights_path

    x, _ = sf.read(librivox[0].path, dtype="float32")
    x = x[: 2 * SR + 100]  # a ragged tail: the last chunk is zero-padded
    ours = speech_probabilities(x)
    jit = torch.jit.load(weights_path())
    jit.reset_states()
    padded = np.pad(x, (0, len(ours) * CHUNK - len(x)))
    with torch.inference_mode():
        ref = [
            float(jit(torch.from_numpy(padded[i * CHUNK : (i + 1) * CHUNK])[None], SR))
            for i in range(len(ours))
        ]
    assert len(ours) == -(-len(x) // CHUNK)
    np.testing.assert_allclose(ours, ref, atol=1e-4)
    assert ours.max() > 0.9 and ours[:3].max() < 0.5  # the clip opens with a breath of silence


def test_speech_is_found_where_the_clips_are(long_audio):
    speech = detect_speech(long_audio.samples, VadOptions())
    found = [(a / SR, b / SR) for a, b in speech.spans]
    assert len(found) == len(long_audio.clips), found  # 2-3 s pauses split every clip from the next
    for (a, b), (start, end) in zip(found, long_audio.clips):
        assert start - 0.6 <= a <= start + 0.2 and end - 0.2 <= b <= end + 0.6, ((a, b), (start, end))


def test_silence_and_noise_hold_no_speech(quiet_files):
    for name, audio in quiet_files.items():
        probs = speech_probabilities(audio)
        assert probs.max() < 0.5, name
        assert detect_speech(audio, VadOptions()).spans == [], name


# ---- the rules ----------------------------------------------------------------------------------
def _probs(*runs: tuple[float, float]) -> np.ndarray:
    """(seconds, probability) runs -> per-chunk probabilities."""
    return np.concatenate([np.full(round(s * CPS), p, np.float32) for s, p in runs])


def test_speech_chunk_rules():
    opts = VadOptions(threshold=0.5, min_speech=0.25, min_silence=1.0, speech_pad=0.0)
    n = 10 * SR

    def chunks(probs, **kw):
        return [(a / SR, b / SR) for a, b in speech_chunks(probs, n, VadOptions(**{**opts.__dict__, **kw}))]

    one = _probs((1, 0.1), (2, 0.9), (3, 0.1))
    assert chunks(one) == [(31 * 0.032, 93 * 0.032)]  # 31 chunks of 32 ms, then 62
    # a 0.5 s dip between words does not end speech; a 1.5 s pause does
    assert len(chunks(_probs((1, 0.1), (1, 0.9), (0.5, 0.1), (1, 0.9), (2, 0.1)))) == 1
    assert len(chunks(_probs((1, 0.1), (1, 0.9), (1.5, 0.1), (1, 0.9), (2, 0.1)))) == 2
    # hysteresis: 0.4 (between neg_threshold 0.35 and threshold) neither starts nor ends speech
    assert chunks(_probs((1, 0.4), (1, 0.1))) == []
    assert len(chunks(_probs((1, 0.9), (2, 0.4), (1, 0.9)))) == 1
    # too short to keep, and speech running to the end
    assert chunks(_probs((1, 0.1), (0.1, 0.9), (2, 0.1))) == []
    assert chunks(_probs((1, 0.1), (1, 0.9))) == [(31 * 0.032, 62 * 0.032)]
    # padding widens each chunk within the audio, and chunks that then touch merge
    padded = chunks(_probs((0.4, 0.9), (1.1, 0.1), (1, 0.9), (3, 0.1)), speech_pad=0.6)
    assert padded == [(0.0, 77 * 0.032 + 0.6)]


def test_a_long_speech_chunk_is_split_at_its_last_pause():
    n = 40 * SR
    unpadded = VadOptions(speech_pad=0.0)

    def chunks(probs, options):
        return [(a // CHUNK, b // CHUNK) for a, b in speech_chunks(probs, n, options)]  # in 32 ms chunks

    # from chunk 31: 5 s of speech, a 0.2 s pause, 3 s, a 64 ms dip (too short to split at), 6 s
    probs = _probs((1, 0.1), (5, 0.9), (0.2, 0.1), (3, 0.9), (0.064, 0.1), (6, 0.9), (2, 0.1))
    assert chunks(probs, unpadded) == [(31, 477)]  # 14.3 s: no limit by default
    assert chunks(probs, replace(unpadded, max_speech_duration_s=20.0)) == [(31, 477)]  # within it
    # over 10 s: split at the pause, the second chunk starting where speech came back
    assert chunks(probs, replace(unpadded, max_speech_duration_s=10.0)) == [(31, 187), (193, 477)]
    # padded, the two meet halfway through the pause instead of merging back into one chunk
    pad = 6400  # samples (0.4 s)
    assert speech_chunks(probs, n, VadOptions(max_speech_duration_s=10.0)) == [
        (31 * CHUNK - pad, 190 * CHUNK),
        (190 * CHUNK, 477 * CHUNK + pad),
    ]
    # the limit reached inside a pause (shorter than min_silence): the next chunk starts with speech
    probs = _probs((1, 0.1), (9.5, 0.9), (0.5, 0.1), (3, 0.9), (2, 0.1))
    assert chunks(probs, replace(unpadded, max_speech_duration_s=10.0)) == [(31, 328), (344, 438)]
    # 25 s without a pause: cut hard every 312 chunks (9.98 s)
    probs = _probs((1, 0.1), (25, 0.9), (2, 0.1))
    assert chunks(probs, replace(unpadded, max_speech_duration_s=10.0)) == [(31, 343), (343, 655), (655, 812)]
    padded = speech_chunks(probs, n, VadOptions(max_speech_duration_s=10.0))
    assert all(b - a <= 10 * SR for a, b in padded) and len(padded) == 3  # 287 chunks each, and pads
    assert all(b == a for (_, b), (a, _) in zip(padded, padded[1:]))  # no speech lost between them
    assert (padded[0][0], padded[-1][1]) == (31 * CHUNK - pad, 812 * CHUNK + pad)


def test_no_speech_chunk_outgrows_max_speech_duration(long_audio):
    plain = detect_speech(long_audio.samples, VadOptions()).spans
    assert detect_speech(long_audio.samples, VadOptions(max_speech_duration_s=60.0)).spans == plain
    limit = 3.0
    assert max(b - a for a, b in plain) > limit * SR  # the clips' speech runs for up to 7.5 s
    split = detect_speech(long_audio.samples, VadOptions(max_speech_duration_s=limit)).spans
    assert len(split) > len(plain) and all(b - a <= limit * SR for a, b in split)
    assert all(any(pa <= a and b <= pb for pa, pb in plain) for a, b in split)  # pieces of the chunks
    # and every 32 ms of speech in them is still decoded
    probs = speech_probabilities(long_audio.samples)
    speech = [i * CHUNK for i in np.flatnonzero(probs >= 0.5) if any(a <= i * CHUNK < b for a, b in plain)]
    assert all(any(a <= x < b for a, b in split) for x in speech)


def test_vad_options_are_validated():
    for bad in (
        {"threshold": 0},
        {"threshold": 1.2},
        {"neg_threshold": 0.7},
        {"min_silence": -1},
        {"max_speech_duration_s": 0},
        {"max_speech_duration_s": float("nan")},
        {"max_speech_duration_s": 0.8},  # a 32 ms chunk of speech and its two 0.4 s pads do not fit
    ):
        with pytest.raises(ValueError):
            VadOptions(**bad)
    assert VadOptions(threshold=0.6).end_threshold == pytest.approx(0.45)
    assert VadOptions(max_speech_duration_s=0.1, speech_pad=0.0).max_speech_duration_s == 0.1


def test_speech_map_joins_and_maps_back():
    samples = np.arange(10 * SR, dtype=np.float32)
    speech = SpanMap([(1 * SR, 3 * SR), (6 * SR, 7 * SR)])
    joined = speech.collect(samples)
    assert joined.shape == (3 * SR,) and joined[0] == SR and joined[2 * SR] == 6 * SR
    assert speech.joins() == [200]  # log-Mel frames (10 ms)
    assert speech.to_original(0.5) == 1.5 and speech.to_original(2.5) == 6.5
    assert speech.to_original(2.0) == 6.0 and speech.to_original(2.0, end=True) == 3.0  # on the join
    assert speech.to_original(5.0, end=True) == 7.0  # never past the chunk's end
    seg = Segment(0, 1.5, 2.5, " x", [], -0.1, 1.0, 0.0, 0.0, 0, None)
    (back,) = speech.restore(iter([seg]))
    assert (back.start, back.end) == (2.5, 6.5)
    assert SpanMap([]).collect(samples).size == 0


# ---- end to end (tiny.en) -----------------------------------------------------------------------
def _text(pair, audio, options):
    segments, info = transcribe(audio, pair, options, source_rate=SR)
    segments = list(segments)
    return segments, info, " ".join(s.text for s in segments)


@pytest.mark.parametrize("strategy", ["sequential", "chunked"])
def test_silence_and_noise_give_no_text(tiny_en_pair, quiet_files, strategy):
    options = TranscribeOptions(strategy=strategy, vad=VadOptions()).with_decode(mode="autoregressive")
    for name, audio in quiet_files.items():
        segments, info, _ = _text(tiny_en_pair, audio, options)
        assert segments == [] and info.windows == 0, name  # nothing was decoded
        assert info.duration == pytest.approx(20.0)


def test_vad_wer_is_within_a_point_of_sequential(tiny_en_pair, long_audio):
    base = TranscribeOptions().with_decode(mode="autoregressive")
    ref = [" ".join(long_audio.texts)]
    _, plain_info, plain = _text(tiny_en_pair, long_audio.samples, base)
    scores = {"sequential": wer(ref, [plain])}

    def in_speech(t: float) -> bool:
        return any(a - 1.0 <= t <= b + 1.0 for a, b in long_audio.clips)

    for strategy in ("sequential", "chunked"):
        options = TranscribeOptions(strategy=strategy, vad=VadOptions()).with_decode(mode="autoregressive")
        segments, info, text = _text(tiny_en_pair, long_audio.samples, options)
        scores[f"{strategy} + vad"] = wer(ref, [text])
        # times are on the recording: segments start and end in (or within 1 s of) a clip, never
        # in a pause (one segment may span two clips: their pause is gone from the decoded audio)
        assert all(in_speech(s.start) and in_speech(s.end) for s in segments), [
            (s.start, s.end) for s in segments
        ]
        assert all(p.end <= s.start + 1e-6 for p, s in zip(segments, segments[1:]))
        assert info.duration == plain_info.duration
        speech_s = sum(b - a for a, b in long_audio.clips)  # the clips; VAD keeps pads around them
        assert speech_s - 1 < info.duration_after_vad < info.duration
        assert plain_info.duration_after_vad is None
    print("tiny.en long-form WER:", {k: f"{v:.3%}" for k, v in scores.items()})
    assert scores["sequential + vad"] <= scores["sequential"] + 0.01
    assert scores["chunked + vad"] <= scores["sequential"] + 0.01


@pytest.mark.slow  # loads tiny.en through the CLI
def test_cli_vad_on_noise_prints_nothing(quiet_files, tmp_path):
    from specasr.cli import main

    path = tmp_path / "noise.wav"
    sf.write(path, quiet_files["noise"], SR)
    result = CliRunner().invoke(
        main, ["transcribe", str(path), "--model", "tiny.en", "--mode", "autoregressive", "--vad"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == ""
    bad = CliRunner().invoke(main, ["transcribe", str(path), "--vad", "--vad-threshold", "1.5"])
    assert bad.exit_code == 2
