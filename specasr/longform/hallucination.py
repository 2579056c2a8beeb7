"""Skipping text heard in silence (`TranscribeOptions.hallucination_silence_threshold`, the
option of openai-whisper's `transcribe`): the sequential seek loop, with word timestamps.

Over a long stretch without speech Whisper may write text anyway (a line said again, "Thank
you."). Such text aligns badly: its words get a low probability, or last implausibly short or
long. Terms:
- a word's *anomaly score*: 1 if its probability is below LOW_PROBABILITY; plus, when its
  duration d is below SHORTEST, 15·(SHORTEST - d) (a word of no length scores 2); plus, when d
  is above LONGEST, d - LONGEST (one second over scores 1);
- a segment is *anomalous* when its first SCORED_WORDS words, punctuation marks left out,
  score ANOMALY_SCORE or more in total, or about as much as there are words (every word
  scored 1 or near it, so a short segment of few words counts too); a segment whose words are
  all punctuation is anomalous, one without words is not.

Per decoded window, with threshold θ seconds (`Skipper.window`):
1. a window not ending on a single timestamp, whose last word ends more than θ before the
   window's end, resumes at that word's end (the usual seek would be its last timestamp);
2. if the window's first segment with words is anomalous and starts more than θ after the
   window, nothing of it is kept: the loop decodes again from that segment's start, so the
   leading silence no longer sits in front of the speech the window may hold;
3. an anomalous segment with silence before it (more than θ since the last speech, or it is
   within θ of the audio's start or EDGE of the window's) and after it (more than θ to the next
   segment with words, or that one is anomalous too, or it ends within EDGE of the window's end)
   is dropped with everything after it in the window; the loop resumes at its start, at least
   one second into the window (so it moves on), or at the audio's end when it ends within θ of it.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

from specasr.options import TranscribeOptions
from specasr.results import Segment, Word

LOW_PROBABILITY = 0.15  # a word the target gives less than this under teacher forcing is suspect
SHORTEST = 0.133  # s: words shorter than this are suspect, the more the shorter
LONGEST = 2.0  # s: words longer than this are suspect, the more the longer
SCORED_WORDS = 8  # a segment is judged by its first words
ANOMALY_SCORE = 3.0  # a segment's words scoring this much make it anomalous
EDGE = 2.0  # s: a segment this close to its window's start (end) counts as having silence there
MIN_ADVANCE = 1.0  # s: a drop resumes at least this far into the window
# marks that are not words for the score: the default joining sets and ASCII punctuation
PUNCTUATION = frozenset(
    TranscribeOptions.prepend_punctuations + TranscribeOptions.append_punctuations + string.punctuation
)


def word_anomaly(word: Word) -> float:
    """How unlike speech one word's alignment is (the module's anomaly score), >= 0."""
    duration = word.end - word.start
    score = 1.0 if word.probability < LOW_PROBABILITY else 0.0
    if duration < SHORTEST:
        score += (SHORTEST - duration) * 15
    if duration > LONGEST:
        score += duration - LONGEST
    return score


def is_punctuation(word: Word) -> bool:
    text = word.word.strip()
    return bool(text) and all(c in PUNCTUATION for c in text)


def is_anomalous(segment: Segment | None) -> bool:
    """Whether a segment's first SCORED_WORDS words (punctuation aside) look hallucinated."""
    if segment is None or not segment.words:
        return False
    scored = [w for w in segment.words if not is_punctuation(w)][:SCORED_WORDS]
    score = sum(word_anomaly(w) for w in scored)
    return score >= ANOMALY_SCORE or score + 0.01 >= len(scored)


def first_with_words(segments: Sequence[Segment]) -> Segment | None:
    return next((s for s in segments if s.words), None)


def last_word_end(segments: Sequence[Segment]) -> float | None:
    """Where the last word of the segments ends (None: no words)."""
    return next((s.words[-1].end for s in reversed(segments) if s.words), None)


def ends_on_one_timestamp(tokens: Sequence[int], ts_begin: int) -> bool:
    """Whether a window's tokens end `… text <|t|>`: it is complete (`windows.split_window`)."""
    return len(tokens) >= 2 and tokens[-2] < ts_begin <= tokens[-1]


@dataclass
class Skipper:
    """The rules above over a sequential transcript, window by window."""

    threshold: float  # s of silence (theta)
    last_speech: float = 0.0  # s: where the last word kept so far ends

    @classmethod
    def maybe(cls, options: TranscribeOptions) -> Skipper | None:
        """A skipper when `options.hallucination_silence_threshold` is set, else None."""
        threshold = options.hallucination_silence_threshold
        return None if threshold is None else cls(threshold)

    def window(
        self,
        segments: Sequence[Segment],
        start: float,
        end: float,
        seek: float,
        complete: bool,
        audio_end: float,
    ) -> tuple[int, float]:
        """One window's segments (with words) -> (how many of them to keep, s to seek to next).

        start, end: the window's audio (s); seek: where the usual rule goes on (s); complete:
        the window ended on a single timestamp; audio_end: where the decoded audio ends (s)."""
        theta = self.threshold
        last = last_word_end(segments)
        if not complete and last is not None and last > start and end - last > theta:
            seek = last  # rule 1: the window's speech ended well before the window
        first = first_with_words(segments)
        if is_anomalous(first) and first.start - start > theta:
            return 0, first.start  # rule 2: decode again without the leading silence
        speech = self.last_speech
        for i, seg in enumerate(segments):
            if not seg.words:
                continue
            if is_anomalous(seg):
                after = first_with_words(segments[i + 1 :])
                next_start = after.words[0].start if after is not None else end
                before_silent = seg.start - speech > theta or seg.start < theta or seg.start - start < EDGE
                after_silent = next_start - seg.end > theta or is_anomalous(after) or end - seg.end < EDGE
                if before_silent and after_silent:  # rule 3
                    resume = audio_end if audio_end - seg.end < theta else max(start + MIN_ADVANCE, seg.start)
                    self._kept(segments[:i])
                    return i, resume
            speech = seg.end
        self._kept(segments)
        return len(segments), seek

    def _kept(self, segments: Sequence[Segment]) -> None:
        last = last_word_end(segments)
        if last is not None:
            self.last_speech = last
