"""`TranscribeOptions.clip_timestamps`: decode only the clips asked for, times on the recording.

The recording is two LibriVox clips with a second of silence between them; the clip asked for
is the second. Decoded alone, the second clip's audio gives a reference transcript, which the
clipped transcription must reproduce, shifted to where the clip lies in the recording.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import soundfile as sf

from specasr.eval.metric import wer
from specasr.longform.spans import SpanMap, clip_spans
from specasr.longform.vad import detect_speech
from specasr.options import TranscribeOptions, VadOptions
from specasr.transcription import transcribe

SR = 16000
GAP = 1.0  # s of digital silence between the two clips


class Recording:
    """first clip, GAP s of silence, second clip: samples float32 [n], the second's start (s)."""

    def __init__(self, first, second):
        a, _ = sf.read(first.path, dtype="float32")
        b, _ = sf.read(second.path, dtype="float32")
        self.second = b  # [n_b]
        self.samples = np.concatenate([a, np.zeros(round(GAP * SR), np.float32), b])  # [n]
        self.start = (len(a) + round(GAP * SR)) / SR  # where the second clip starts (s)
        self.duration = len(self.samples) / SR
        self.texts = first.text, second.text


@pytest.fixture(scope="module")
def recording(librivox) -> Recording:
    first, second = librivox[0], librivox[2]  # "and mister john dashwood ...", "unless to be ..."
    assert "dashwood" in first.text and "dashwood" not in second.text
    return Recording(first, second)


def _options(strategy: str, **kw) -> TranscribeOptions:
    opts = TranscribeOptions(strategy=strategy, batch_size=2, **kw)
    return opts.with_decode(mode="autoregressive", language="en")


def _run(pair, samples, options):
    segments, info = transcribe(samples, pair, options, source_rate=SR)
    return list(segments), info


# ---- the spans (no model) -------------------------------------------------------------------------
def test_clip_spans_are_cut_to_the_audio():
    n = 10 * SR
    assert clip_spans((1.0, 2.5, 4.0, 5.0), n) == [(SR, 2.5 * SR), (4 * SR, 5 * SR)]
    assert clip_spans((7.0,), n) == [(7 * SR, n)]  # an odd count: the last clip runs to the end
    assert clip_spans((8.0, 12.0, 14.0), n) == [(8 * SR, n)]  # cut at the end; past it: dropped
    spans = SpanMap(clip_spans((1.0, 2.0, 6.0), n))
    assert spans.collect(np.arange(n, dtype=np.float32)).shape == (5 * SR,)
    assert spans.to_original(0.5) == 1.5 and spans.to_original(1.5) == 6.5
    assert spans.to_original(1.0, end=True) == 2.0 and spans.to_original(1.0) == 6.0  # on the join


def test_clip_timestamps_are_validated():
    for bad in (
        (-1.0, 2.0),  # before the start
        (math.nan,),
        (1.0, math.inf),
        (3.0, 2.0),  # ends before it starts
        (2.0, 2.0),  # holds nothing
        (0.0, 2.0, 1.0, 3.0),  # overlapping
        (4.0, 5.0, 1.0, 2.0),  # out of order
        [0.0, 1.0],  # a list: options stay hashable
        "0,1",
    ):
        with pytest.raises(ValueError, match="clip_timestamps"):
            TranscribeOptions(clip_timestamps=bad)
    for good in (None, (), (1.5,), (0.0, 1.0, 1.0, 2.0), (np.float32(0.5), 1)):
        assert TranscribeOptions(clip_timestamps=good).clip_timestamps == good


def test_vad_searches_only_inside_the_clips(recording):
    n = recording.samples.size
    everywhere = detect_speech(recording.samples, VadOptions()).spans
    assert any(b < recording.start * SR for _, b in everywhere)  # the first clip holds speech
    inside = detect_speech(recording.samples, VadOptions(), within=clip_spans((recording.start,), n)).spans
    assert inside and all(a >= recording.start * SR for a, _ in inside), inside


# ---- end to end (base) ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def second_alone(base_pair, recording):
    """The second clip transcribed on its own (one window: both strategies decode it alike)."""
    return _run(base_pair, recording.second, _options("sequential"))[0]


@pytest.mark.parametrize(
    "strategy, clips",
    [("sequential", "clip"), ("chunked", "to the end")],
)
def test_only_the_clip_is_transcribed_on_the_recordings_time(
    base_pair, recording, second_alone, strategy, clips
):
    t = recording.start
    clip_timestamps = (t, recording.duration) if clips == "clip" else (t,)
    segments, info = _run(base_pair, recording.samples, _options(strategy, clip_timestamps=clip_timestamps))
    text = " ".join(s.text for s in segments)
    assert "dashwood" not in text.lower(), text  # nothing of the first clip
    assert wer([recording.texts[1]], [text]) <= 0.1, text
    assert all(t - 1e-6 <= s.start <= s.end <= recording.duration + 1e-6 for s in segments)
    # the clip's audio is decoded as if alone; its times are shifted to the recording's
    assert [s.text for s in segments] == [s.text for s in second_alone]
    np.testing.assert_allclose(
        [(s.start, s.end) for s in segments], [(s.start + t, s.end + t) for s in second_alone]
    )
    assert info.duration == pytest.approx(recording.duration)
    assert info.duration_after_vad == pytest.approx(recording.duration - t)  # the seconds decoded


def test_vad_inside_the_clip(base_pair, recording):
    t = recording.start
    segments, info = _run(
        base_pair, recording.samples, _options("sequential", clip_timestamps=(t,), vad=VadOptions())
    )
    text = " ".join(s.text for s in segments)
    assert "dashwood" not in text.lower() and wer([recording.texts[1]], [text]) <= 0.1, text
    assert segments and all(s.start >= t - 1e-6 for s in segments)
    assert 0 < info.duration_after_vad <= recording.duration - t


def test_clips_past_the_end_decode_nothing(base_pair, recording):
    segments, info = _run(base_pair, recording.samples, _options("sequential", clip_timestamps=(60.0, 70.0)))
    assert segments == [] and info.windows == 0 and info.duration_after_vad == 0
