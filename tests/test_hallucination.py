"""Text heard in silence (longform/hallucination.py): the word anomaly score, anomalous
segments, and the skipper's three rules on hand-made windows; the option's validation."""

from __future__ import annotations

import pytest

from specasr.longform import hallucination as H
from specasr.options import TranscribeOptions
from specasr.results import Segment, Word
from specasr.stats import DecodeStats


def _seg(start: float, end: float, *words: tuple[str, float, float, float]) -> Segment:
    """A segment with words (text, start, end, probability)."""
    timed = [Word(*w) for w in words]
    text = "".join(w.word for w in timed)
    return Segment(0, start, end, text, [], -0.3, 1.2, 0.1, 0.0, 0, DecodeStats(), words=timed)


def _speech(start: float, n: int = 4) -> Segment:
    """n plausible words of 0.4 s from `start`."""
    words = [(f" w{k}", start + 0.4 * k, start + 0.4 * (k + 1), 0.9) for k in range(n)]
    return _seg(start, start + 0.4 * n, *words)


def _heard(start: float) -> Segment:
    """' Thank you.' as Whisper writes it in silence: unlikely words, the second one too short."""
    thank, you = (" Thank", start, start + 0.9, 0.1), (" you.", start + 0.9, start + 1.0, 0.12)
    return _seg(start, start + 1.0, thank, you)


# ---- scores ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "start, end, probability, score",
    [
        (1.0, 1.4, 0.9, 0.0),  # a plausible word
        (1.0, 1.4, 0.1, 1.0),  # unlikely
        (1.0, 1.0, 0.9, 0.133 * 15),  # no length: about 2
        (1.0, 1.1, 0.9, (0.133 - 0.1) * 15),  # a little short: a little suspect
        (1.0, 4.5, 0.9, 1.5),  # 1.5 s longer than 2 s
        (1.0, 4.5, 0.05, 2.5),
    ],
)
def test_word_anomaly_scores_probability_and_duration(start, end, probability, score):
    assert H.word_anomaly(Word(" x", start, end, probability)) == pytest.approx(score)


def test_a_segment_is_anomalous_when_its_first_words_score_enough():
    assert not H.is_anomalous(_speech(0.0, 6))
    assert H.is_anomalous(_heard(0.0))  # 2 words scoring about 2.6: every word suspect
    three_of_eight = _speech(0.0, 8)
    three_of_eight.words[2:5] = [Word(w.word, w.start, w.end, 0.1) for w in three_of_eight.words[2:5]]
    assert H.is_anomalous(three_of_eight)
    two_of_eight = _speech(0.0, 8)
    two_of_eight.words[2:4] = [Word(w.word, w.start, w.end, 0.1) for w in two_of_eight.words[2:4]]
    assert not H.is_anomalous(two_of_eight)
    late = _speech(0.0, 12)  # only the first 8 words are judged
    late.words[8:] = [Word(w.word, w.start, w.end, 0.01) for w in late.words[8:]]
    assert not H.is_anomalous(late)
    # punctuation marks do not count: the same 8 words with 5 unlikely marks among them
    marks = _speech(0.0, 8)
    marks.words[1:1] = [Word(",", 0.4, 0.4, 0.01)] * 5
    assert not H.is_anomalous(marks)
    assert H.is_anomalous(_seg(0.0, 1.0, ("...", 0.0, 1.0, 0.9)))  # nothing but punctuation
    assert not H.is_anomalous(_seg(0.0, 1.0)) and not H.is_anomalous(None)  # no words


# ---- the skipper -------------------------------------------------------------------------------
WINDOW = (30.0, 60.0)  # the window's audio (s)


def _window(skipper: H.Skipper, segments, seek: float = 60.0, complete: bool = True, audio_end=100.0):
    return skipper.window(segments, *WINDOW, seek, complete, audio_end)


def test_a_segment_heard_in_silence_is_dropped_with_what_follows():
    """Speech to 31.6 s, then ' Thank you.' alone at 45 s: dropped, and the loop resumes at it."""
    segments = [_speech(30.0), _heard(45.0), _speech(47.0)]
    assert _window(H.Skipper(2.0), segments[:2]) == (1, 45.0)
    # followed by speech 1 s later it is kept: no silence after it
    assert _window(H.Skipper(2.0), segments) == (3, 60.0)
    # a longer threshold: 13.4 s since the speech is no silence of 15 s, and 45 s is far from 0
    assert _window(H.Skipper(15.0), segments[:2]) == (2, 60.0)


def test_plausible_speech_in_silence_is_kept():
    segments = [_speech(30.0), _speech(45.0)]
    assert _window(H.Skipper(2.0), segments) == (2, 60.0)


def test_silence_before_counts_from_the_last_speech_kept_in_earlier_windows():
    heard = _heard(35.0)  # 5 s into the window: not near its start
    assert _window(H.Skipper(2.0), [heard]) == (0, 35.0)  # rule 2 (leading silence): decode again from 35 s
    near = _heard(31.5)  # within 2 s of the window's start: silence before it
    assert _window(H.Skipper(2.0), [near, _speech(40.0)]) == (0, 31.5)  # and 7.5 s of silence after it
    # 2.5 s into the window, within the threshold of 3 s (rule 2 does not apply): the speech kept
    # in an earlier window decides whether there was silence before it
    hm = _seg(32.5, 33.5, (" hm", 32.5, 33.5, 0.1))
    earlier = H.Skipper(3.0)
    assert _window(earlier, [_speech(29.0, 5)], seek=30.0) == (1, 30.0)  # a window before: speech to 31 s
    assert earlier.last_speech == pytest.approx(31.0)
    assert _window(earlier, [hm, _speech(40.0)]) == (2, 60.0)
    assert _window(H.Skipper(3.0), [hm, _speech(40.0)]) == (0, 32.5)  # no speech before: dropped


def test_a_drop_resumes_a_second_into_the_window_at_least_and_at_the_audio_end_near_it():
    heard = _heard(30.2)
    assert _window(H.Skipper(2.0), [heard]) == (0, 31.0)  # not at 30.2 s: the loop must move on
    assert _window(H.Skipper(2.0), [_speech(30.0), _heard(45.0)], audio_end=47.0) == (1, 47.0)


def test_a_window_cut_off_resumes_where_its_last_word_ends_if_that_is_long_before_its_end():
    segments = [_speech(30.0, 5)]  # words to 32 s
    assert _window(H.Skipper(2.0), segments, seek=45.0, complete=False) == (1, 32.0)
    assert _window(H.Skipper(2.0), segments, seek=45.0, complete=True) == (1, 45.0)
    assert _window(H.Skipper(40.0), segments, seek=45.0, complete=False) == (1, 45.0)


def test_ends_on_one_timestamp():
    ts = 100
    assert H.ends_on_one_timestamp([ts, 5, 6, ts + 20], ts)
    assert not H.ends_on_one_timestamp([ts, 5, 6, ts + 20, ts + 20], ts)
    assert not H.ends_on_one_timestamp([ts, 5, 6], ts) and not H.ends_on_one_timestamp([ts], ts)


def test_the_option_needs_word_timestamps_the_sequential_strategy_and_seconds():
    assert H.Skipper.maybe(TranscribeOptions()) is None
    on = TranscribeOptions(word_timestamps=True, hallucination_silence_threshold=2)
    assert H.Skipper.maybe(on) == H.Skipper(2.0)
    for kw, message in [
        (dict(hallucination_silence_threshold=2.0), "needs word_timestamps"),
        (dict(word_timestamps=True, hallucination_silence_threshold=0.0), "> 0"),
        (dict(word_timestamps=True, hallucination_silence_threshold=float("nan")), "> 0"),
        (dict(word_timestamps=True, hallucination_silence_threshold=2.0, strategy="chunked"), "sequential"),
        (dict(append_punctuations=None), "append_punctuations"),
    ]:
        with pytest.raises(ValueError, match=message):
            TranscribeOptions(**kw)


# ---- the seek loop, on real speech (slow) ------------------------------------------------------
@pytest.mark.slow  # loads tiny.en
def test_the_seek_loop_drops_a_flagged_segment_and_goes_on_after_it(tiny_en_pair, librivox, monkeypatch):
    """The sequential loop applies the skipper's verdicts: with the second clip's sentence ("He was
    not an ill-disposed young man.", 1.8 s of silence before it, 1.3 s and more after) judged heard
    in silence (the judgment patched: tiny.en aligns real speech well), it is dropped; the loop
    decodes again from it, drops it again and resumes 1 s into it, past "He was not"; the speech
    around it is kept, in order. Without the option the sentence is there."""
    from benchmarks.longform import long_recording
    from specasr.transcription import transcribe

    rec = long_recording(librivox[0].path.parent, repeats=1)  # five clips, 2-3 s of silence between

    def run(**kw):
        options = TranscribeOptions(word_timestamps=True, **kw).with_decode(mode="autoregressive")
        segments, _ = transcribe(rec.samples, tiny_en_pair, options, source_rate=16000)
        return list(segments)

    flagged = lambda seg: seg is not None and "he was not" in seg.text.lower()  # noqa: E731
    monkeypatch.setattr(H, "is_anomalous", flagged)
    plain = " ".join(s.text for s in run()).lower()
    skipped = run(hallucination_silence_threshold=1.0)
    said = " ".join(s.text for s in skipped).lower()
    assert "he was not" in plain and "he was not" not in said
    for words in ("dashwood", "selfish", "respectable", "amiable himself"):
        assert words in said, said
    assert [s.id for s in skipped] == list(range(len(skipped)))
    assert all(a.end <= b.start + 1e-6 for a, b in zip(skipped, skipped[1:]))


def test_a_word_heard_in_a_long_stretch_of_noise_is_dropped(base_pair, librivox):
    """A real hallucination: a LibriVox sentence, 60 s of faint noise (-50 dB RMS), another
    sentence. With the no-speech skip off, `base` hears " a" (probability ~0, 1.4 s long) in
    the noise; with a 2 s hallucination threshold that segment is gone and both sentences stay."""
    from dataclasses import replace

    import numpy as np
    import soundfile as sf

    from specasr.transcription import transcribe

    sr = 16_000
    first, second = (sf.read(str(c.path), dtype="float32")[0] for c in librivox[:2])
    noise = (np.random.default_rng(1).standard_normal(60 * sr) * 10 ** (-50 / 20)).astype(np.float32)
    audio = np.concatenate([first, noise, second])
    quiet = (len(first) / sr + 0.5, (len(first) + len(noise)) / sr - 0.5)  # inside the noise
    base = TranscribeOptions(no_speech_threshold=None, word_timestamps=True)
    base = base.with_decode(mode="autoregressive", language="en")

    def run(**kw):
        segments, _ = transcribe(audio, base_pair, replace(base, **kw), source_rate=sr)
        return list(segments)

    heard = [s for s in run() if quiet[0] < s.start and s.end < quiet[1]]
    assert heard and all(w.probability < 0.15 for s in heard for w in s.words)
    kept = run(hallucination_silence_threshold=2.0)
    assert not [s for s in kept if quiet[0] < s.end and s.start < quiet[1]]
    text = " ".join(s.text for s in kept)
    assert "Dashwood" in text and "young man" in text
