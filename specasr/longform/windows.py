"""Window decoding shared by both long-form strategies: prompts, the temperature fallback,
the no-speech skip, the digital-silence gate, windows of log-Mel frames, and cutting a window's
tokens at timestamps into segments.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from specasr.constants import FRAMES_PER_SECOND, HOP_LENGTH, N_FRAMES, N_TEXT_CTX, SECONDS_PER_TIMESTAMP
from specasr.features import pad_or_trim
from specasr.options import TranscribeOptions
from specasr.results import DecodeResult, Segment
from specasr.stats import DecodeStats


def initial_prompt_tokens(tok, options: TranscribeOptions) -> list[int]:
    """Tokens of `initial_prompt` (with Whisper's leading space), or none."""
    return tok.encode(" " + options.initial_prompt.strip()) if options.initial_prompt else []


def hotword_tokens(tok, options: TranscribeOptions) -> list[int]:
    """Tokens of `hotwords` (with Whisper's leading space), or none."""
    words = (options.hotwords or "").strip()
    return tok.encode(" " + words) if words else []


def window_prompt(hot: list[int], previous: list[int], forced: bool) -> list[int] | None:
    """A window's prompt: the hotwords (unless a prefix is forced on this window), then as
    much of the previous text as fits after them in the prompt's half of the context (the
    start sequence keeps a prompt's last N_TEXT_CTX // 2 - 1 tokens: the hotwords must not be
    the ones cut); None when there is neither."""
    hot = [] if forced else hot
    room = max(N_TEXT_CTX // 2 - 1 - len(hot), 0)
    return (hot + previous[len(previous) - room :]) or None


def needs_fallback(result: DecodeResult, options: TranscribeOptions) -> bool:
    cr, lp, ns = options.compression_ratio_threshold, options.logprob_threshold, options.no_speech_threshold
    bad = (cr is not None and result.compression_ratio > cr) or (lp is not None and result.avg_logprob < lp)
    silence = ns is not None and result.no_speech_prob > ns and lp is not None and result.avg_logprob < lp
    return bad and not silence


def quiet_frames(samples: np.ndarray, peak: float | None) -> np.ndarray | None:
    """samples [n] (float32, 16 kHz) -> per log-Mel frame whether its hop of samples stays
    below `peak` [ceil(n / HOP_LENGTH)] (bool), or None when `peak` is None (no gate)."""
    if peak is None:
        return None
    whole = len(samples) // HOP_LENGTH * HOP_LENGTH
    hops = samples[:whole].reshape(-1, HOP_LENGTH)  # [whole hops, 160], a view: no copy of the audio
    loud = np.maximum(hops.max(axis=1), -hops.min(axis=1))  # each hop's peak |x|
    if whole < len(samples):  # the last, partial hop
        tail = samples[whole:]
        loud = np.append(loud, max(tail.max(), -tail.min()))
    return loud < peak


def is_quiet(quiet: np.ndarray | None, seek: int, size: int) -> bool:
    """Whether the window of `size` frames from `seek` is digital silence (`quiet_frames`)."""
    return quiet is not None and bool(quiet[seek : seek + size].all())


def is_silence(result: DecodeResult, options: TranscribeOptions) -> bool:
    """Whisper's no-speech skip: P(nospeech) above the threshold, unless the log-prob is good."""
    ns, lp = options.no_speech_threshold, options.logprob_threshold
    if ns is None or result.no_speech_prob <= ns:
        return False
    return lp is None or result.avg_logprob < lp


def decode_with_fallback(
    engine,
    target_states: Tensor,
    draft_states: Tensor | None,
    options: TranscribeOptions,
    language: str,
    prompt: list[int] | None,
    seed: int,
    stats: DecodeStats,
) -> list[DecodeResult]:
    """Decodes B windows from their encoder states, by the `engine` (longform/engine.py); rows
    whose result needs a fallback are decoded again, together, at the next temperature. Each
    row keeps its last result.

    `options.decode` is used with three fields set here: temperature steps through
    `options.temperatures` (whose first value is `decode.temperature`, as TranscribeOptions
    checks), language is the given or detected `language`, and seed is this window's `seed`.

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
        decoded = engine.decode(t_states, d_states, opts, prompt, stats)
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


def encode_windows(engine, windows: Tensor, stats: DecodeStats) -> tuple[Tensor, Tensor | None]:
    """windows [B, n_mels, 3000] -> (target states, draft states), timed into `stats`, by the
    `engine` (longform/engine.py) that does the transcription's model work."""
    return engine.encode(windows, stats)


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


def window_segments(
    tok,
    result: DecodeResult,
    pieces: list[tuple[int, int, list[int]]],
    offset: float,
    duration: float,
    window: int,
    stats: DecodeStats,
) -> list[Segment]:
    """A window's pieces (from `split_window`) -> its segments, numbered from 0 in the window.

    offset: the window's start (s); duration: where the window's audio ends (s; segments end no
    later). Pieces without text or time are dropped."""
    out: list[Segment] = []
    first_token = 0
    for start_ts, end_ts, tokens in pieces:
        kinds = result.token_kinds[first_token : first_token + len(tokens)]
        first_token += len(tokens)  # pieces are consecutive slices of result.tokens
        start = offset + start_ts * SECONDS_PER_TIMESTAMP
        end = min(offset + end_ts * SECONDS_PER_TIMESTAMP, duration)
        text = tok.decode(tokens)
        if end <= start or not text.strip():
            continue
        out.append(
            Segment.from_result(
                result,
                id=len(out),
                start=start,
                end=end,
                text=text,
                tokens=tokens,
                window=window,
                stats=stats,
                token_kinds=kinds,
                seek=round(offset * FRAMES_PER_SECOND),
            )
        )
    return out
