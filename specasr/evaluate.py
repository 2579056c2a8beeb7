"""Word error rate on Whisper-normalised text, as the paper and Distil-Whisper report it."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import jiwer


@lru_cache(maxsize=1)
def _english_normalizer():
    from whisper_normalizer.english import EnglishTextNormalizer  # ships english.json

    return EnglishTextNormalizer()


def normalize(text: str) -> str:
    """Whisper's English normaliser: lowercase, spelling map, numbers, punctuation removed."""
    return _english_normalizer()(text)


def wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Corpus WER over normalised text; pairs whose normalised reference is empty are dropped."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    pairs = [(normalize(r), normalize(h)) for r, h in zip(references, hypotheses)]
    pairs = [(r, h) for r, h in pairs if r.strip()]
    if not pairs:
        raise ValueError("no non-empty references")
    refs, hyps = zip(*pairs)
    return jiwer.wer(list(refs), list(hyps))
