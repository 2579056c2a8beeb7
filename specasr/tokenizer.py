"""Whisper's special tokens and text <-> token conversion, over a `tokenizers` JSON file.

English-only checkpoints (vocab 51864) and multilingual ones (51865+) number their special
tokens differently, so every id is looked up by name, never hard-coded. Some shipped
`tokenizer.json` files lack the timestamp tokens; they always follow `<|notimestamps|>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer

from specasr.constants import SECONDS_PER_TIMESTAMP

# Whisper's language codes in token order (<|en|> first); the model's tokenizer decides
# how many of them exist (99 for v1/v2 models, 100 for large-v3).
LANGUAGES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no "
    "th ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw "
    "gl mr pa si km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl "
    "mg as tt haw ln ha ba jw su yue"
).split()

TASKS = ("transcribe", "translate")


@dataclass
class Tokenizer:
    """Wraps a `tokenizers.Tokenizer` with Whisper's special-token vocabulary."""

    hf: _HFTokenizer
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        return cls(_HFTokenizer.from_file(str(path)))

    def _id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def _required(self, token: str) -> int:
        tid = self._id(token)
        if tid is None:
            raise ValueError(f"tokenizer has no {token} token; is this a Whisper tokenizer?")
        return tid

    # ---- special tokens -------------------------------------------------------------
    @cached_property
    def eot(self) -> int:
        return self._required("<|endoftext|>")

    @cached_property
    def sot(self) -> int:
        return self._required("<|startoftranscript|>")

    @cached_property
    def translate(self) -> int:
        return self._required("<|translate|>")

    @cached_property
    def transcribe(self) -> int:
        return self._required("<|transcribe|>")

    @cached_property
    def sot_lm(self) -> int:
        return self._required("<|startoflm|>")

    @cached_property
    def sot_prev(self) -> int:
        return self._required("<|startofprev|>")

    @cached_property
    def no_speech(self) -> int:
        tid = self._id("<|nospeech|>")
        return tid if tid is not None else self._required("<|nocaptions|>")

    @cached_property
    def no_timestamps(self) -> int:
        return self._required("<|notimestamps|>")

    @cached_property
    def timestamp_begin(self) -> int:
        """Id of <|0.00|>; timestamps step by SECONDS_PER_TIMESTAMP from here to the end of the vocab."""
        return self.no_timestamps + 1

    @cached_property
    def language_tokens(self) -> dict[str, int]:
        out = {}
        for code in LANGUAGES:
            tid = self._id(f"<|{code}|>")
            if tid is not None and self.sot < tid < self.translate:
                out[code] = tid
        return out

    @cached_property
    def multilingual(self) -> bool:
        # English-only checkpoints keep the language tokens but use the GPT-2 vocabulary,
        # where <|endoftext|> is 50256; multilingual vocabularies put it at 50257.
        return self.eot >= 50257

    # ---- sequences ------------------------------------------------------------------
    def sot_sequence(
        self, language: str | None = "en", task: str = "transcribe", timestamps: bool = False
    ) -> list[int]:
        """The decoder's forced start: <|sot|> [<|lang|> <|task|>] [<|notimestamps|>]."""
        seq = [self.sot]
        if self.multilingual:
            lang = language or "en"
            if lang not in self.language_tokens:
                raise ValueError(f"unknown language {lang!r}; known: {sorted(self.language_tokens)}")
            if task not in TASKS:
                raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
            seq += [self.language_tokens[lang], self.transcribe if task == "transcribe" else self.translate]
        if not timestamps:
            seq.append(self.no_timestamps)
        return seq

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: list[int]) -> str:
        """Text of the ordinary tokens; special and timestamp tokens are dropped."""
        return self.hf.decode([t for t in tokens if t < self.eot], skip_special_tokens=False)

    def decode_with_timestamps(self, tokens: list[int]) -> str:
        """Text with timestamp tokens rendered as <|1.08|>."""
        parts: list[str] = []
        run: list[int] = []
        for t in tokens:
            if t >= self.timestamp_begin:
                parts.append(self.hf.decode(run) if run else "")
                run = []
                parts.append(f"<|{(t - self.timestamp_begin) * SECONDS_PER_TIMESTAMP:.2f}|>")
            elif t < self.eot:
                run.append(t)
        if run:
            parts.append(self.hf.decode(run))
        return "".join(parts)

    @cached_property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)
