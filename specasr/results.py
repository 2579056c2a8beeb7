"""What decoding and transcription return: `DecodeResult` per decoded window row,
`Segment`s of a transcript (with `Word`s when word timestamps are on), and the
`TranscriptionInfo` beside them."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specasr.stats import DecodeStats

if TYPE_CHECKING:
    from specasr.options import TranscribeOptions


def compression_ratio(text: str) -> float:
    """len(utf-8 text) / len(zlib(text)): repetition loops compress well (ratio > 2.4)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


@dataclass
class DecodeResult:
    tokens: list[int]  # sampled tokens, without the start sequence and <|endoftext|>
    text: str  # decoded text of `tokens` (timestamps dropped)
    avg_logprob: float  # sum of target log-probs of the sampled tokens (and eot) / (len + 1)
    no_speech_prob: float  # target P(<|nospeech|>) at the <|startoftranscript|> position
    temperature: float
    language: str | None
    stats: DecodeStats = field(repr=False)  # shared by every row of one batch
    # per token of `tokens`: "draft" (accepted), "corrected", "bonus" or "target" (decode.step),
    # or "prefix" (forced by DecodeOptions.prefix)
    token_kinds: list[str] = field(default_factory=list, repr=False)

    @property
    def compression_ratio(self) -> float:
        """gzip ratio of the text: repetition loops compress well (Whisper falls back above 2.4)."""
        return compression_ratio(self.text)

    @property
    def encoder_s(self) -> float:
        return self.stats.encoder_s

    @property
    def decoder_s(self) -> float:
        return self.stats.decoder_s


@dataclass
class Word:
    """One word of a segment, timed by cross-attention alignment (longform/words.py)."""

    word: str  # its text, with the leading space and merged punctuation (" Hello,")
    start: float  # seconds from the start of the audio
    end: float  # seconds from the start of the audio; start <= end
    probability: float  # mean target probability of its tokens under teacher forcing

    def to_dict(self) -> dict:
        return {
            "word": self.word,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "probability": round(self.probability, 4),
        }


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
    # per token of `tokens`, where it came from (DecodeResult.token_kinds); empty when unknown (chunked)
    token_kinds: list[str] = field(default_factory=list, repr=False)
    # with word timestamps: its words, in order and inside [start, end]; None when off
    words: list[Word] | None = None
    seek: int = 0  # the 10 ms frame of the decoded audio where its window starts (openai-whisper's seek)
    language: str | None = None  # its window's detected language (TranscribeOptions.multilingual); else None

    @classmethod
    def from_result(
        cls,
        result: DecodeResult,
        *,
        id: int,
        start: float,
        end: float,
        tokens: list[int],
        text: str,
        window: int,
        stats: DecodeStats,
        token_kinds: list[str] | None = None,
        seek: int = 0,
    ) -> Segment:
        """A segment cut from a window's decode: the window-level scores come from `result`."""
        return cls(
            id=id,
            start=start,
            end=end,
            text=text,
            tokens=tokens,
            avg_logprob=result.avg_logprob,
            compression_ratio=result.compression_ratio,
            no_speech_prob=result.no_speech_prob,
            temperature=result.temperature,
            window=window,
            stats=stats,
            token_kinds=token_kinds or [],
            seek=seek,
        )

    def to_dict(self) -> dict:
        s = self.stats
        words = {} if self.words is None else {"words": [w.to_dict() for w in self.words]}
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
            **({} if self.language is None else {"language": self.language}),
            "stats": {
                "proposed": s.proposed,
                "accepted": s.accepted,
                "acceptance_rate": s.acceptance_rate,
                "token_acceptance": s.token_acceptance,
                "target_calls": s.target_calls,
                "draft_calls": s.draft_calls,
                "tokens_per_target_call": s.tokens_per_target_call,
            },
            **words,
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
    # detected: the language's probability on the first window, and every language's, most
    # likely first (faster-whisper's names); None when the language was given
    language_probability: float | None = None
    all_language_probs: list[tuple[str, float]] | None = None
    # seconds decoded: the speech VAD kept and/or the clip timestamps' spans; None: all of it
    duration_after_vad: float | None = None

    def to_dict(self) -> dict:
        return {
            "language": self.language,
            "language_detected": self.language_detected,
            "language_probability": _rounded(self.language_probability, 4),
            "duration": round(self.duration, 3),
            "duration_after_vad": _rounded(self.duration_after_vad, 3),
            "strategy": self.options.strategy,
            "mode": self.options.decode.mode,
            "model": self.model,
            "draft": self.draft,
            "windows": self.windows,
        }


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
