"""The `chunked` strategy: overlapping 30 s windows, decoded in batches, merged on tokens.

Windows start every 30 - overlap seconds. Each batch of windows is encoded once and decoded
together (rows share the initial prompt, or none; there is no running prompt). A window's
text tokens get times from its timestamp segments (spread evenly inside each segment).

A window keeps its complete timestamp segments ("pieces"); its incomplete last segment is
left to the next window. Merging a window B into the transcript so far (A): the tokens of A
and of B that fall in their overlap are compared, and the longest run of equal tokens
(>= MIN_RUN) is the seam: A keeps what precedes its middle, B supplies the rest. Without
such a run (silence, or the windows disagree) A is kept whole, and B adds the pieces whose
middle lies beyond what A covers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from specasr.constants import FRAMES_PER_SECOND, N_FRAMES, SECONDS_PER_TIMESTAMP
from specasr.decode.stats import DecodeStats
from specasr.longform.windows import (
    decode_with_fallback,
    encode_windows,
    initial_prompt_tokens,
    is_silence,
    split_window,
    window_mel,
)
from specasr.options import TranscribeOptions
from specasr.results import DecodeResult, Segment, TranscriptionInfo

SEAM_TOLERANCE = 1.0  # seconds: tokens this far outside an overlap still take part in aligning it
MIN_RUN = 3  # equal tokens in a row that make a seam; shorter runs are mostly chance (" the", ".")


@dataclass(frozen=True)
class _Piece:
    """A timestamp segment of one window's output, in seconds from the start of the audio."""

    start: float
    end: float
    result: DecodeResult
    window: int
    stats: DecodeStats


@dataclass(frozen=True)
class _Token:
    id: int
    start: float
    end: float
    piece: _Piece

    @property
    def mid(self) -> float:
        return (self.start + self.end) / 2


def window_tokens(
    result: DecodeResult, ts_begin: int, eot: int, offset: float, size: int, last: bool, window: int, stats
) -> tuple[list[_Token], float]:
    """A window's text tokens with times, and the end (s) of the audio it covers.

    The pieces are the window's complete timestamp segments (as the sequential strategy cuts
    them). An incomplete last segment is dropped, since the next window covers it, except
    in the last window, where it runs to the window's end.
    """
    pieces, advance = split_window(result.tokens, ts_begin, size)
    length = size / FRAMES_PER_SECOND
    covered = min(advance, size) / FRAMES_PER_SECOND
    spans = [(a * SECONDS_PER_TIMESTAMP, b * SECONDS_PER_TIMESTAMP, toks) for a, b, toks in pieces]
    used = sum(len(toks) for _, _, toks in pieces)
    if last and used < len(result.tokens):
        spans.append((covered, length, result.tokens[used:]))
        covered = length
    out: list[_Token] = []
    for start, end, toks in spans:
        text = [t for t in toks if t < eot]
        if not text:
            continue
        start = min(start, length)
        end = max(min(end, length), start)
        piece = _Piece(offset + start, offset + end, result, window, stats)
        step = (end - start) / len(text)
        out += [
            _Token(t, piece.start + i * step, piece.start + (i + 1) * step, piece) for i, t in enumerate(text)
        ]
    return out, offset + covered


def common_run(a: list[int], b: list[int]) -> tuple[int, int, int]:
    """The longest run a[i : i + n] == b[j : j + n], as (i, j, n); the first one on ties."""
    best = (0, 0, 0)
    prev = [0] * (len(b) + 1)  # prev[j + 1]: length of the common run ending at a[i - 1], b[j]
    for i in range(len(a)):
        cur = [0] * (len(b) + 1)
        for j in range(len(b)):
            if a[i] == b[j]:
                cur[j + 1] = prev[j] + 1
                if cur[j + 1] > best[2]:
                    best = (i - cur[j + 1] + 1, j - cur[j + 1] + 1, cur[j + 1])
        prev = cur
    return best


def merge(stream: list[_Token], new: list[_Token], overlap_start: float, covered: float) -> list[_Token]:
    """stream (covering audio up to `covered` s) + the next window's tokens, which start at
    `overlap_start` s, with the overlap kept once."""
    if not new:
        return stream
    tail = [k for k, t in enumerate(stream) if t.mid >= overlap_start - SEAM_TOLERANCE]
    head = [k for k, t in enumerate(new) if t.mid <= covered + SEAM_TOLERANCE]
    i, j, n = common_run([stream[k].id for k in tail], [new[k].id for k in head])
    if n >= MIN_RUN:
        return stream[: tail[i + n // 2]] + new[head[j + n // 2] :]
    # no shared run: keep the transcript, and the next window's pieces that lie mostly beyond it
    return stream + [t for t in new if (t.piece.start + t.piece.end) / 2 > covered]


def _segments(tokens: list[_Token], pair, first_id: int, last_end: float) -> list[Segment]:
    """Runs of tokens from one piece -> segments, kept in order and non-overlapping."""
    out: list[Segment] = []
    k = 0
    while k < len(tokens):
        piece = tokens[k].piece
        run = [tokens[k]]
        while k + len(run) < len(tokens) and tokens[k + len(run)].piece is piece:
            run.append(tokens[k + len(run)])
        k += len(run)
        text = pair.tokenizer.decode([t.id for t in run])
        if not text.strip():
            continue
        start = max(run[0].start, last_end)
        last_end = max(run[-1].end, start)
        out.append(
            Segment.from_result(
                piece.result,
                id=first_id + len(out),
                start=start,
                end=last_end,
                text=text,
                tokens=[t.id for t in run],
                window=piece.window,
                stats=piece.stats,
            )
        )
    return out


def window_starts(content: int, overlap: float) -> list[int]:
    """Start frames of the windows covering `content` frames, consecutive ones sharing `overlap` s."""
    step = N_FRAMES - round(overlap * FRAMES_PER_SECOND)
    starts = [0]
    while starts[-1] + N_FRAMES < content:
        starts.append(starts[-1] + step)
    return starts


def chunked(
    pair,
    mel: Tensor,
    options: TranscribeOptions,
    info: TranscriptionInfo,
    first: tuple[Tensor, Tensor | None] | None = None,
) -> Iterator[Segment]:
    """mel: (n_mels, content frames + 3000) -> segments, one batch of windows at a time.

    first: the first window's encoder states, when they were computed for language detection.
    """
    tok = pair.tokenizer
    content = mel.shape[-1] - N_FRAMES
    starts = window_starts(content, options.chunk_overlap)
    prompt = initial_prompt_tokens(tok, options) or None
    stream: list[_Token] = []
    covered = 0.0  # end (s) of the last window merged into the stream
    n_segments, last_end = 0, 0.0
    for b0 in range(0, len(starts), options.batch_size):
        batch = starts[b0 : b0 + options.batch_size]
        sizes = [min(N_FRAMES, content - s) for s in batch]
        stats = DecodeStats()
        states = _encode(pair, mel, batch, sizes, stats, first if b0 == 0 else None)
        results = decode_with_fallback(
            pair, *states, options, info.language, prompt, options.decode.seed + b0, stats
        )
        info.stats = info.stats.merge(stats)
        info.windows += len(batch)
        for w, (seek, size, result) in enumerate(zip(batch, sizes, results)):
            if is_silence(result, options):
                continue
            offset, last = seek / FRAMES_PER_SECOND, b0 + w == len(starts) - 1
            new, new_covered = window_tokens(
                result, tok.timestamp_begin, tok.eot, offset, size, last, b0 + w, stats
            )
            stream = merge(stream, new, offset, covered)
            covered = max(covered, new_covered)
        # tokens before the next window's overlap are final
        final_before = (
            starts[b0 + len(batch)] / FRAMES_PER_SECOND - SEAM_TOLERANCE
            if b0 + len(batch) < len(starts)
            else None
        )
        cut = (
            len(stream)
            if final_before is None
            else next((k for k, t in enumerate(stream) if t.mid >= final_before), len(stream))
        )
        while 0 < cut < len(stream) and stream[cut].piece is stream[cut - 1].piece:
            cut -= 1  # keep a piece that straddles the boundary whole, for the next round
        segments = _segments(stream[:cut], pair, n_segments, last_end)
        stream = stream[cut:]
        if segments:
            n_segments += len(segments)
            last_end = segments[-1].end
        yield from segments


def _encode(
    pair, mel: Tensor, batch: list[int], sizes: list[int], stats: DecodeStats, first
) -> tuple[Tensor, Tensor | None]:
    """Encoder states of a batch of windows [B, 1500, d]; reuses `first` for window 0."""
    todo = batch[1:] if first is not None else batch
    if not todo:
        return first
    windows = torch.cat([window_mel(mel, s, n) for s, n in zip(todo, sizes[-len(todo) :])])
    t_states, d_states = encode_windows(pair, windows, stats)
    if first is None:
        return t_states, d_states
    shared = d_states is t_states
    t_states = torch.cat([first[0], t_states])
    if d_states is None or shared:
        return t_states, d_states if d_states is None else t_states
    return t_states, torch.cat([first[1], d_states])
