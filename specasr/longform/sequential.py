"""The `sequential` strategy: Whisper's seek loop.

Each 30 s window starting at `seek` is decoded with timestamp tokens. The window's tokens
split into segments at each pair of consecutive timestamps `<|t1|><|t2|>`, and then:
- a window that ends on a single timestamp (`… text <|t|>`) is complete: seek past it;
- otherwise its last segment may be cut off: seek to the last complete timestamp and decode
  the rest again in the next window;
- a window without a closed pair is one segment covering it.

Each window falls back through the temperature schedule while its output looks degenerate
(gzip compression ratio > 2.4, a repetition loop; or average log-prob < -1). When every
temperature fails under the previous text as prompt, the window is decoded again without it
(the prompt is what sent it into a loop: the same sentence heard again right after itself), and
it does not prompt the next window; Whisper would keep the last, sampled at T = 1. A window that is
probably silence (P(<|nospeech|>) > 0.6 with a low log-prob) is skipped, and one of digital
silence (no sample near speech level) is skipped before it is encoded. The encoder runs
once per window; every fallback step reuses its states (`windows.py`).
With word timestamps, `hallucination_silence_threshold` drops text heard in a long silence and
seeks past the silence (`hallucination.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from functools import partial

import numpy as np
from torch import Tensor

from specasr.constants import FRAMES_PER_SECOND, N_FRAMES
from specasr.longform.hallucination import Skipper, ends_on_one_timestamp
from specasr.longform.windows import (
    decode_with_fallback,
    encode_windows,
    hotword_tokens,
    initial_prompt_tokens,
    is_quiet,
    is_silence,
    needs_fallback,
    split_window,
    window_mel,
    window_prompt,
    window_segments,
)
from specasr.longform.words import WordTimer
from specasr.options import TranscribeOptions
from specasr.results import Segment, TranscriptionInfo
from specasr.stats import DecodeStats


def sequential(
    engine,
    mel: Tensor,
    options: TranscribeOptions,
    info: TranscriptionInfo,
    first: tuple[Tensor, Tensor | None] | None = None,
    quiet: np.ndarray | None = None,
) -> Iterator[Segment]:
    """mel: (n_mels, content frames + 3000) -> segments, window by window.

    first: the first window's encoder states, when they were computed for language detection;
    quiet: per content frame, digital silence (`windows.quiet_frames`): a window that is all
    quiet is skipped undecoded.
    """
    pair = engine.pair
    tok = pair.tokenizer
    content = mel.shape[-1] - N_FRAMES
    all_tokens = initial_prompt_tokens(tok, options)
    prompt_since = 0  # all_tokens[prompt_since:] prompts the next window
    hot = hotword_tokens(tok, options)
    later = replace(options, decode=replace(options.decode, prefix=None))  # the prefix forces window 0
    seek, n_segments = 0, 0
    words = WordTimer.maybe(pair, options, info)  # None unless options.word_timestamps
    skipper = Skipper.maybe(options)  # None unless options.hallucination_silence_threshold
    while seek < content:
        size = min(N_FRAMES, content - seek)
        if is_quiet(quiet, seek, size):
            seek += size
            continue
        offset = seek / FRAMES_PER_SECOND
        stats = DecodeStats()
        states = (
            first
            if first is not None and seek == 0
            else encode_windows(engine, window_mel(mel, seek, size), stats)
        )
        opts = options if seek == 0 else later
        window_language = None if options.multilingual else info.language  # None: this window detects
        forced = bool(opts.decode.prefix)
        previous = all_tokens[prompt_since:]
        window = info.windows
        result = decode_with_fallback(
            engine,
            *states,
            opts,
            window_language,
            window_prompt(hot, previous, forced),
            options.decode.seed + window,
            stats,
        )[0]
        unprompted = bool(previous) and needs_fallback(result, options)
        if unprompted:  # every temperature failed under the prompt: the prompt sent it into a loop
            result = decode_with_fallback(
                engine,
                *states,
                opts,
                window_language,
                window_prompt(hot, [], forced),
                options.decode.seed + window,
                stats,
            )[0]
        info.stats = info.stats.merge(stats)
        info.windows += 1
        if is_silence(result, options):
            seek += size
            continue
        pieces, advance = split_window(result.tokens, tok.timestamp_begin, size)
        start, seek = seek, seek + advance
        current = window_segments(tok, result, pieces, offset, info.duration, window, stats)
        language = result.language if options.multilingual else None
        current = [replace(seg, id=n_segments + k, language=language) for k, seg in enumerate(current)]
        if words is not None and current:  # one teacher-forced pass over the window's final tokens
            spoken = [t for s in current for t in s.tokens]
            engine.run(partial(words.add, window, states[0], offset, size, spoken))
            current = words.attach(current)
        if skipper is not None and current:  # text heard in silence: drop it, seek past the silence
            complete = ends_on_one_timestamp(result.tokens, tok.timestamp_begin)
            end, audio_end = offset + size / FRAMES_PER_SECOND, content / FRAMES_PER_SECOND
            keep, resume = skipper.window(current, offset, end, seek / FRAMES_PER_SECOND, complete, audio_end)
            words.forget(sum(1 for s in current[keep:] if s.words))
            current = current[:keep]
            seek = min(content, max(start + 1, round(resume * FRAMES_PER_SECOND)))
        all_tokens += [t for s in current for t in s.tokens]
        if (
            unprompted
            or not options.condition_on_previous_text
            or result.temperature > options.prompt_reset_temperature
        ):
            prompt_since = len(all_tokens)
        n_segments += len(current)
        yield from current
