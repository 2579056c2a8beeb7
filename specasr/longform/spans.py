"""The stretches of a recording that are decoded, joined end to end, and the time map back.

Two things pick them: voice activity detection (vad.py: the speech chunks) and
`TranscribeOptions.clip_timestamps` (`clip_spans`: the clips a user asked for; with VAD, the speech
inside them). `SpanMap` joins the spans into the audio that is decoded and maps segment (and word)
times on that audio back to the recording. Unlike openai-whisper, which runs its seek loop clip by
clip, a window may reach across the join of two spans, so a segment may start in one span and end
in the next (as with faster-whisper's VAD).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from specasr.constants import HOP_LENGTH, SAMPLE_RATE
from specasr.results import Segment


@dataclass(frozen=True)
class SpanMap:
    """Spans of a recording, joined end to end into the audio that is decoded."""

    spans: list[tuple[int, int]]  # (start, end) samples of each span in the recording, in order

    @property
    def starts(self) -> list[int]:
        """Where each span starts in the joined audio (samples)."""
        return list(np.cumsum([0] + [b - a for a, b in self.spans[:-1]]))

    def collect(self, samples: np.ndarray) -> np.ndarray:
        """samples [n] -> the spans, joined: float32 [sum of span lengths]."""
        if not self.spans:
            return np.zeros(0, np.float32)
        return np.concatenate([samples[a:b] for a, b in self.spans]).astype(np.float32, copy=False)

    def joins(self) -> list[int]:
        """Log-Mel frames of the joined audio where one span ends and the next begins."""
        return [s // HOP_LENGTH for s in self.starts[1:]]

    def to_original(self, t: float, end: bool = False) -> float:
        """Seconds in the joined audio -> seconds in the recording. A time exactly on a join is
        the end of the span before it when `end`, else the start of the span after it."""
        sample = t * SAMPLE_RATE
        starts = self.starts
        k = (bisect.bisect_left if end else bisect.bisect_right)(starts, sample) - 1
        k = min(max(k, 0), len(self.spans) - 1)
        a, b = self.spans[k]
        return min(a + sample - starts[k], b) / SAMPLE_RATE

    def restore(self, segments: Iterator[Segment]) -> Iterator[Segment]:
        """Segments timed on the joined audio -> the same, timed on the recording."""
        for seg in segments:
            start = self.to_original(seg.start)
            seg = replace(seg, start=start, end=max(start, self.to_original(seg.end, end=True)))
            if getattr(seg, "words", None):
                seg = replace(seg, words=[self._word(w) for w in seg.words])
            yield seg

    def _word(self, word):
        start = self.to_original(word.start)
        return replace(word, start=start, end=max(start, self.to_original(word.end, end=True)))


def clip_spans(clip_timestamps: Sequence[float], n_samples: int) -> list[tuple[int, int]]:
    """(start1, end1, start2, end2, ...) seconds -> [(start, end)] samples of the recording.

    An odd count's last clip runs to the end of the audio; clips are cut at the end of the
    audio, and those that then hold no sample are dropped.
    """
    bounds = [min(round(t * SAMPLE_RATE), n_samples) for t in clip_timestamps]
    if len(bounds) % 2:
        bounds.append(n_samples)
    return [(a, b) for a, b in zip(bounds[::2], bounds[1::2]) if b > a]
