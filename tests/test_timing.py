"""Segment ends trimmed back to the last voiced frame."""

from __future__ import annotations

import torch

from specasr.longform.timing import trim_trailing_silence
from specasr.results import Segment
from specasr.stats import DecodeStats


def _segment(start: float, end: float) -> Segment:
    return Segment(
        id=0,
        start=start,
        end=end,
        text=" x",
        tokens=[],
        avg_logprob=-0.1,
        compression_ratio=1.0,
        no_speech_prob=0.0,
        temperature=0.0,
        window=0,
        stats=DecodeStats(),
    )


def _mel(levels: list[tuple[float, float]], seconds: float) -> torch.Tensor:
    """(n_mels=80, frames) with the given (until_second, level) steps."""
    frames = torch.empty(int(seconds * 100))
    t0 = 0
    for until, level in levels:
        frames[t0 : int(until * 100)] = level
        t0 = int(until * 100)
    return frames[None].expand(80, -1) + 0.01 * torch.randn(
        80, frames.numel(), generator=torch.Generator().manual_seed(0)
    )


def test_end_moves_back_to_the_end_of_speech():
    mel = _mel([(1.0, -1.5), (4.0, 0.8), (7.0, -1.5)], 7.0)  # silence, speech 1–4 s, silence
    (seg,) = trim_trailing_silence(iter([_segment(0.5, 7.0)]), mel)
    assert abs(seg.end - 4.2) <= 0.05  # last voiced frame + 0.2 s pad
    assert seg.start == 0.5


def test_quiet_but_voiced_tail_is_kept():
    mel = _mel([(3.0, 0.8), (5.0, 0.5)], 5.0)  # 12 dB quieter tail: still speech
    (seg,) = trim_trailing_silence(iter([_segment(0.0, 5.0)]), mel)
    assert seg.end == 5.0


def test_never_extends_and_keeps_steady_noise():
    mel = _mel([(6.0, 0.3)], 6.0)  # steady noise or speech throughout
    segs = list(trim_trailing_silence(iter([_segment(0.0, 2.0), _segment(2.0, 6.0)]), mel))
    assert [s.end for s in segs] == [2.0, 6.0]


def test_next_utterance_onset_after_a_pause_is_not_this_segments_speech():
    # speech 0–3 s, pause to 5 s, the next utterance's first 0.3 s inside this segment
    mel = _mel([(3.0, 0.8), (5.0, -1.5), (5.3, 0.8)], 5.3)
    (seg,) = trim_trailing_silence(iter([_segment(0.0, 5.3)]), mel)
    assert abs(seg.end - 3.2) <= 0.05


def test_long_final_run_is_kept():
    mel = _mel([(3.0, 0.8), (5.0, -1.5), (7.0, 0.8)], 7.0)  # a real second phrase, 2 s
    (seg,) = trim_trailing_silence(iter([_segment(0.0, 7.0)]), mel)
    assert seg.end == 7.0
