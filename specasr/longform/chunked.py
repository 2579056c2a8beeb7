"""The `chunked` strategy: the audio cut at pauses into spans of at most 30 s, decoded in batches.

Cutting (`cut_spans`): a span ends at the quietest point (lowest log-Mel level, averaged over
0.2 s) within the last `cut_search` s before its 30 s limit, or, with voice activity detection,
at the last join of two speech chunks that fits (chunks are packed, as faster-whisper's batched
pipeline does). Spans never overlap, so there is nothing to merge, and a seam falls inside a word
only when speech runs on without a dip for `cut_search` s.

Each span is a *lane* that runs Whisper's seek loop on its own (longform/sequential.py): a window
reaches from the lane's seek to its end; a decode that ends early (on a closed timestamp pair, or
cut off mid-segment) seeks to its last complete timestamp, and the lane's next window decodes the
rest. Speech is never skipped because a decode stopped early. Every round decodes the current
window of up to `batch_size` unfinished lanes as one batch (rows share the initial prompt, or none;
there is no running prompt). A lane's segments are yielded once it and every lane before it are done.

Without a prompt, a follow-up window may say again what its lane's previous window said when
that window's timestamps ran early; a prefix of its text equal to the end of the lane's text
(at least MIN_REPEAT tokens) is dropped (`drop_repeat`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from specasr.backends.cpu import heap
from specasr.constants import FRAMES_PER_SECOND, N_FRAMES
from specasr.longform.windows import (
    decode_with_fallback,
    encode_windows,
    hotword_tokens,
    initial_prompt_tokens,
    is_quiet,
    is_silence,
    split_window,
    window_mel,
    window_prompt,
    window_segments,
)
from specasr.longform.words import WordTimer
from specasr.options import TranscribeOptions
from specasr.results import Segment, TranscriptionInfo
from specasr.stats import DecodeStats

SMOOTH_FRAMES = 21  # 0.2 s: the quietest point is a pause or a dip between words, not one quiet frame
MIN_REPEAT = 3  # text tokens a follow-up window must repeat before they count as a repeat


def cut_spans(level: Tensor, search: float, joins: Sequence[int] = ()) -> list[tuple[int, int]]:
    """level: [frames] mean log-Mel level per 10 ms frame of the content -> [(start, end)] frames.

    Spans of at most 3000 frames tile the content. Each ends at the latest of `joins` (frames
    where two speech chunks meet) that fits, else at the quietest point of its last `search` s.
    """
    content = level.shape[0]
    smooth = F.avg_pool1d(level[None, None].float(), SMOOTH_FRAMES, 1, SMOOTH_FRAMES // 2, False)[0, 0]
    window = round(search * FRAMES_PER_SECOND)
    spans, start = [], 0
    while content - start > N_FRAMES:
        lo, hi = start + N_FRAMES - window, start + N_FRAMES
        fitting = [j for j in joins if start < j <= hi]
        if fitting:
            end = fitting[-1]
        elif window > 0:
            end = lo + int(torch.argmin(smooth[lo:hi]))
        else:
            end = hi
        spans.append((start, end))
        start = end
    if start < content or not spans:
        spans.append((start, content))
    return spans


def drop_repeat(segments: list[Segment], said: list[int], eot: int, tok) -> list[Segment]:
    """segments of a follow-up window, less the longest prefix of their text tokens that equals
    a suffix of `said` (the lane's text tokens so far), if it is at least MIN_REPEAT long."""
    text = [t for s in segments for t in s.tokens if t < eot]
    limit = min(len(text), len(said))
    repeat = max((n for n in range(MIN_REPEAT, limit + 1) if text[:n] == said[-n:]), default=0)
    out = []
    for seg in segments:
        keep = []  # indices of the tokens kept
        for i, t in enumerate(seg.tokens):
            if t < eot and repeat > 0:
                repeat -= 1
            else:
                keep.append(i)
        if len(keep) == len(seg.tokens):
            out.append(seg)
            continue
        tokens = [seg.tokens[i] for i in keep]
        if not tok.decode(tokens).strip():
            continue
        kinds = [seg.token_kinds[i] for i in keep] if seg.token_kinds else []
        out.append(replace(seg, tokens=tokens, text=tok.decode(tokens), token_kinds=kinds))
    return out


@dataclass
class _Lane:
    """One span's seek loop: frames [start, end) of the content, decoded up to `seek`."""

    start: int
    end: int
    seek: int
    segments: list[Segment] = field(default_factory=list)
    said: list[int] = field(default_factory=list)  # text tokens of `segments`

    @property
    def done(self) -> bool:
        return self.seek >= self.end


def chunked(
    engine,
    mel: Tensor,
    options: TranscribeOptions,
    info: TranscriptionInfo,
    first: tuple[Tensor, Tensor | None] | None = None,
    joins: Sequence[int] = (),
    quiet: np.ndarray | None = None,
) -> Iterator[Segment]:
    """mel: (n_mels, content frames + 3000) -> segments, one batch of lane windows at a time.

    first: the first window's encoder states, when they were computed for language detection;
    joins: content frames where the speech chunks kept by voice activity detection meet;
    quiet: per content frame, digital silence (`windows.quiet_frames`): a lane's window that is
    all quiet is skipped undecoded.
    """
    pair = engine.pair
    tok = pair.tokenizer
    content = mel.shape[-1] - N_FRAMES
    level = mel[:, :content].float().mean(dim=0)  # [content frames]
    lanes = [_Lane(a, b, a) for a, b in cut_spans(level, options.cut_search, joins)]
    # every window: the hotwords, then the initial prompt (there is no running prompt)
    prompt = window_prompt(hotword_tokens(tok, options), initial_prompt_tokens(tok, options), False)
    words = WordTimer.maybe(pair, options, info)  # None unless options.word_timestamps
    shown, n_segments = 0, 0  # lanes yielded so far, segments yielded so far
    states = None  # the round's encoder states
    while shown < len(lanes):
        for lane in lanes[shown:]:
            while not lane.done and is_quiet(quiet, lane.seek, min(N_FRAMES, lane.end - lane.seek)):
                lane.seek += min(N_FRAMES, lane.end - lane.seek)
        todo = [lane for lane in lanes[shown:] if not lane.done][: options.batch_size]
        if todo:  # (none: every lane left ended in digital silence)
            seeks = [lane.seek for lane in todo]
            sizes = [min(N_FRAMES, lane.end - lane.seek) for lane in todo]
            reuse = first if seeks[0] == 0 and sizes[0] == min(N_FRAMES, content) else None
            first = None  # the detection window is reused at most once
            stats = DecodeStats()
            if states is not None:  # the last round's go before this round's are made
                states = results = None
                # a round's decode leaves its caches (cross K/V, a pass's logits for every row) free
                # in the heap, in sizes the next round, its rows ragged otherwise, reuses only in
                # part: the heap grew by most of a round every round (docs/benchmarks.md, "Memory
                # of the batched path")
                heap.trim()
            states = _encode(engine, mel, seeks, sizes, stats, reuse)
            results = decode_with_fallback(
                engine, *states, options, info.language, prompt, options.decode.seed + info.windows, stats
            )
            info.stats = info.stats.merge(stats)
            for row, (lane, size, result) in enumerate(zip(todo, sizes, results)):
                window = info.windows + row
                if is_silence(result, options):
                    lane.seek += size
                    continue
                offset = lane.seek / FRAMES_PER_SECOND
                pieces, advance = split_window(result.tokens, tok.timestamp_begin, size)
                lane.seek += min(advance, size)
                lane_end = min(info.duration, lane.end / FRAMES_PER_SECOND)  # beyond it the window is padding
                current = window_segments(tok, result, pieces, offset, lane_end, window, stats)
                if lane.said:
                    current = drop_repeat(current, lane.said, tok.eot, tok)
                if words is not None and current:  # one teacher-forced pass over the window's final tokens
                    spoken = [t for s in current for t in s.tokens]
                    engine.run(partial(words.add, window, states[0][row : row + 1], offset, size, spoken))
                    current = words.attach(current)
                lane.segments += current
                lane.said += [t for seg in current for t in seg.tokens if t < tok.eot]
            info.windows += len(todo)
        while shown < len(lanes) and lanes[shown].done:
            for seg in lanes[shown].segments:
                yield replace(seg, id=n_segments)
                n_segments += 1
            shown += 1


def _encode(
    engine, mel: Tensor, seeks: list[int], sizes: list[int], stats: DecodeStats, first
) -> tuple[Tensor, Tensor | None]:
    """Encoder states of a batch of windows [B, 1500, d]; reuses `first` for row 0."""
    todo = list(zip(seeks, sizes))[1:] if first is not None else list(zip(seeks, sizes))
    if not todo:
        return first
    windows = torch.cat([window_mel(mel, s, n) for s, n in todo])  # [B', n_mels, 3000]
    t_states, d_states = encode_windows(engine, windows, stats)
    if first is None:
        return t_states, d_states
    shared = d_states is t_states
    t_states = torch.cat([first[0], t_states])
    if d_states is None or shared:
        return t_states, d_states if d_states is None else t_states
    return t_states, torch.cat([first[1], d_states])
