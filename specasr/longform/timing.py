"""Segment end refinement from the audio's energy.

Whisper ends a segment with the timestamp at which the *next* speech begins, so after a
pause the end runs on through the silence (seconds, for subtitles), sometimes into the
first syllable of the next utterance when that timestamp is late. Here each segment's end
moves back to its last voiced frame: a 10 ms frame whose mean log-Mel level is within
`drop_db` of the segment's loud frames (90th percentile). A short voiced run at the very
end (≤ `onset` s) behind a pause (≥ `pause` s) is the next utterance's onset and is dropped
too. Decoding is untouched; only the reported `end` changes, never beyond the decoded one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import Tensor

from specasr.constants import FRAMES_PER_SECOND
from specasr.results import Segment

DB_PER_UNIT = 40.0  # Whisper's features are (log10(power) + 4) / 4: one unit is 40 dB


def trim_trailing_silence(
    segments: Iterator[Segment],
    mel: Tensor,
    *,
    drop_db: float = 20.0,
    pad: float = 0.2,
    onset: float = 0.6,
    pause: float = 0.5,
) -> Iterator[Segment]:
    """mel: (n_mels, frames) log-Mel of the whole recording; yields the segments with ends trimmed."""
    level = mel.float().mean(dim=0)  # [frames] mean log-Mel level per 10 ms frame
    for seg in segments:
        a = int(seg.start * FRAMES_PER_SECOND)
        b = min(int(seg.end * FRAMES_PER_SECOND), level.shape[0])
        if b - a < 2:
            yield seg
            continue
        frames = level[a:b]
        loud = torch.quantile(frames, 0.9)
        voiced = torch.nonzero(frames >= loud - drop_db / DB_PER_UNIT).flatten().tolist()
        last = _speech_end(voiced, round(onset * FRAMES_PER_SECOND), round(pause * FRAMES_PER_SECOND))
        last += a  # one past the last voiced frame of this segment's own speech
        end = min(seg.end, max(seg.start + pad, last / FRAMES_PER_SECOND + pad))
        yield replace(seg, end=end) if end < seg.end else seg


def _speech_end(voiced: list[int], onset: int, pause: int, bridge: int = 20) -> int:
    """One past the last voiced frame, ignoring a final stretch of at most `onset` frames
    that follows a gap of at least `pause` frames. voiced: sorted frame indices (non-empty);
    gaps shorter than `bridge` frames (dips between syllables) do not split a stretch."""
    runs = [[voiced[0], voiced[0]]]  # [first, last] frame of each voiced stretch
    for f in voiced[1:]:
        if f - runs[-1][1] - 1 < bridge:
            runs[-1][1] = f
        else:
            runs.append([f, f])
    if len(runs) > 1:
        (_, prev_last), (first, last) = runs[-2], runs[-1]
        if last - first + 1 <= onset and first - prev_last - 1 >= pause:
            return prev_last + 1
    return runs[-1][1] + 1
