"""Long-form pieces shared by both strategies, and the `sequential` strategy.

Sequential is Whisper's seek loop. Each 30 s window starting at `seek` is decoded with
timestamp tokens. The window's tokens split into segments at each pair of consecutive
timestamps `<|t1|><|t2|>`, and then:
- a window that ends on a single timestamp (`… text <|t|>`) is complete: seek past it;
- otherwise its last segment may be cut off: seek to the last complete timestamp and decode
  the rest again in the next window;
- a window without a closed pair is one segment covering it.

Each window falls back through the temperature schedule while its output looks degenerate
(gzip compression ratio > 2.4, a repetition loop; or average log-prob < -1). A window that is
probably silence (P(<|nospeech|>) > 0.6 with a low log-prob) is skipped. The encoder runs
once per window; every fallback step reuses its states.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from specasr.decoding import DecodeResult, decode_states
from specasr.features import HOP_LENGTH, N_FRAMES, pad_or_trim
from specasr.options import TranscribeOptions
from specasr.stats import DecodeStats, timed

FRAMES_PER_SECOND = 16000 // HOP_LENGTH  # 100 mel frames per second
SECONDS_PER_TIMESTAMP = 0.02  # one timestamp token step; 2 mel frames


@dataclass
class Segment:
    id: int  # position in the transcript, from 0
    start: float  # seconds from the start of the audio
    end: float  # seconds from the start of the audio
    text: str
    tokens: list[int]  # the segment's tokens (sequential: with its timestamp tokens)
    avg_logprob: float  # of the window's decode it came from
    compression_ratio: float  # gzip ratio of that window's text
    no_speech_prob: float  # P(<|nospeech|>) of that window
    temperature: float  # the fallback temperature that produced it
    window: int  # index of its window (chunked: of its batch); segments of one window share `stats`
    stats: DecodeStats = field(repr=False)  # speculative statistics of its window, fallbacks included

    def to_dict(self) -> dict:
        s = self.stats
        return {
            "id": self.id,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "text": self.text,
            "tokens": self.tokens,
            "avg_logprob": self.avg_logprob,
            "compression_ratio": self.compression_ratio,
            "no_speech_prob": self.no_speech_prob,
            "temperature": self.temperature,
            "window": self.window,
            "stats": {
                "proposed": s.proposed,
                "accepted": s.accepted,
                "acceptance_rate": s.acceptance_rate,
                "token_acceptance": s.token_acceptance,
                "target_calls": s.target_calls,
                "draft_calls": s.draft_calls,
                "tokens_per_target_call": s.tokens_per_target_call,
            },
        }


@dataclass
class TranscriptionInfo:
    language: str  # the decoding language ("en" for English-only models)
    language_detected: bool  # detected from the first window rather than given
    duration: float  # seconds of audio
    options: TranscribeOptions
    model: str  # target name
    draft: str | None  # draft name
    stats: DecodeStats = field(default_factory=DecodeStats)  # summed over windows decoded so far
    windows: int = 0  # windows decoded so far; both fill in as the segments are consumed

    def to_dict(self) -> dict:
        return {
            "language": self.language,
            "language_detected": self.language_detected,
            "duration": round(self.duration, 3),
            "strategy": self.options.strategy,
            "mode": self.options.decode.mode,
            "model": self.model,
            "draft": self.draft,
            "windows": self.windows,
        }


# ---- window decoding shared by both strategies -----------------------------------------
def initial_prompt_tokens(tok, options: TranscribeOptions) -> list[int]:
    """Tokens of `initial_prompt` (with Whisper's leading space), or none."""
    return tok.encode(" " + options.initial_prompt.strip()) if options.initial_prompt else []


def compression_ratio(text: str) -> float:
    """len(utf-8 text) / len(zlib(text)): repetition loops compress well (ratio > 2.4)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def needs_fallback(result: DecodeResult, options: TranscribeOptions) -> bool:
    cr, lp, ns = options.compression_ratio_threshold, options.logprob_threshold, options.no_speech_threshold
    bad = (cr is not None and compression_ratio(result.text) > cr) or (
        lp is not None and result.avg_logprob < lp
    )
    silence = ns is not None and result.no_speech_prob > ns and lp is not None and result.avg_logprob < lp
    return bad and not silence


def is_silence(result: DecodeResult, options: TranscribeOptions) -> bool:
    """Whisper's no-speech skip: P(nospeech) above the threshold, unless the log-prob is good."""
    ns, lp = options.no_speech_threshold, options.logprob_threshold
    if ns is None or result.no_speech_prob <= ns:
        return False
    return lp is None or result.avg_logprob < lp


def decode_with_fallback(
    pair,
    target_states: Tensor,
    draft_states: Tensor | None,
    options: TranscribeOptions,
    language: str,
    prompt: list[int] | None,
    seed: int,
    stats: DecodeStats,
) -> list[DecodeResult]:
    """Decodes B windows from their encoder states; rows whose result needs a fallback are
    decoded again, together, at the next temperature. Each row keeps its last result.

    target_states: (B, 1500, d_target); draft_states: (B, 1500, d_draft) or None.
    """
    results: list[DecodeResult | None] = [None] * target_states.shape[0]
    todo = list(range(target_states.shape[0]))
    for temperature in options.temperatures:
        idx = torch.tensor(todo, device=target_states.device)
        t_states = target_states if len(todo) == len(results) else target_states[idx]
        d_states = draft_states
        if draft_states is not None and len(todo) < len(results):
            d_states = t_states if draft_states is target_states else draft_states[idx]
        opts = replace(options.decode, temperature=temperature, language=language, seed=seed)
        decoded = decode_states(pair, t_states, d_states, opts, prompt, stats)
        for row, result in zip(todo, decoded):
            results[row] = result
        todo = [row for row, result in zip(todo, decoded) if needs_fallback(result, options)]
        if not todo:
            break
    return results


def window_mel(mel: Tensor, seek: int, size: int) -> Tensor:
    """mel [n_mels, frames] -> one window [1, n_mels, 3000]: `size` frames from `seek`, then
    zeros (Whisper pads the last window's features, not its samples)."""
    return pad_or_trim(mel[:, seek : seek + size], N_FRAMES)[None]


def encode_windows(pair, windows: Tensor, stats: DecodeStats) -> tuple[Tensor, Tensor | None]:
    """windows [B, n_mels, 3000] -> (target states, draft states), timed into `stats`."""
    with timed(stats, "encoder_s", pair.device):
        return pair.encode(windows)


# ---- the sequential strategy ------------------------------------------------------------
def split_window(tokens: list[int], ts_begin: int, size: int) -> tuple[list[tuple[int, int, list[int]]], int]:
    """A window's tokens -> ([(start, end, tokens)] in timestamp steps, frames to seek).

    size: frames of audio in the window (3000 except for the last one).
    """
    is_ts = [t >= ts_begin for t in tokens]
    single_ending = len(tokens) >= 2 and not is_ts[-2] and is_ts[-1]
    consecutive = [i for i in range(1, len(tokens)) if is_ts[i] and is_ts[i - 1]]
    if not consecutive:
        stamps = [t - ts_begin for t in tokens if t >= ts_begin]
        end = stamps[-1] if stamps and stamps[-1] > 0 else size // 2
        return [(0, end, tokens)], size
    pieces = []
    last = 0
    for cut in consecutive + ([len(tokens)] if single_ending else []):
        piece = tokens[last:cut]
        start = piece[0] - ts_begin if piece[0] >= ts_begin else 0
        pieces.append((start, piece[-1] - ts_begin, piece))
        last = cut
    advance = size if single_ending else (tokens[last - 1] - ts_begin) * 2
    return pieces, advance if advance > 0 else size


def sequential(
    pair,
    mel: Tensor,
    options: TranscribeOptions,
    info: TranscriptionInfo,
    first: tuple[Tensor, Tensor | None] | None = None,
) -> Iterator[Segment]:
    """mel: (n_mels, content frames + 3000) -> segments, window by window.

    first: the first window's encoder states, when they were computed for language detection.
    """
    tok = pair.tokenizer
    content = mel.shape[-1] - N_FRAMES
    all_tokens = initial_prompt_tokens(tok, options)
    prompt_since = 0  # all_tokens[prompt_since:] prompts the next window
    seek, n_segments = 0, 0
    while seek < content:
        size = min(N_FRAMES, content - seek)
        offset = seek / FRAMES_PER_SECOND
        stats = DecodeStats()
        states = (
            first
            if first is not None and seek == 0
            else encode_windows(pair, window_mel(mel, seek, size), stats)
        )
        prompt = all_tokens[prompt_since:] or None
        window = info.windows
        result = decode_with_fallback(
            pair, *states, options, info.language, prompt, options.decode.seed + window, stats
        )[0]
        info.stats = info.stats.merge(stats)
        info.windows += 1
        if is_silence(result, options):
            seek += size
            continue
        pieces, advance = split_window(result.tokens, tok.timestamp_begin, size)
        seek += advance
        current = []
        for start_ts, end_ts, tokens in pieces:
            start = offset + start_ts * SECONDS_PER_TIMESTAMP
            end = min(offset + end_ts * SECONDS_PER_TIMESTAMP, info.duration)
            text = tok.decode(tokens)
            if end <= start or not text.strip():
                continue
            current.append(
                Segment(
                    id=n_segments + len(current),
                    start=start,
                    end=end,
                    text=text,
                    tokens=tokens,
                    avg_logprob=result.avg_logprob,
                    compression_ratio=compression_ratio(result.text),
                    no_speech_prob=result.no_speech_prob,
                    temperature=result.temperature,
                    window=window,
                    stats=stats,
                )
            )
        all_tokens += [t for s in current for t in s.tokens]
        if not options.condition_on_previous_text or result.temperature > options.prompt_reset_temperature:
            prompt_since = len(all_tokens)
        n_segments += len(current)
        yield from current
