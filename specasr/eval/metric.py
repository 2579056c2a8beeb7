"""Word error rate on Whisper-normalised text, as the paper and Distil-Whisper compute it."""

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


def wer_normalized(references: Sequence[str], hypotheses: Sequence[str]) -> tuple[float, int, int]:
    """Corpus WER of normalised texts -> (wer, utterances, reference words); pairs whose
    reference is empty are dropped, as the reference evaluation code does."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    pairs = [(r, h) for r, h in zip(references, hypotheses) if r.strip()]
    if not pairs:
        raise ValueError("no non-empty references")
    refs, hyps = (list(x) for x in zip(*pairs))
    return jiwer.wer(refs, hyps), len(refs), sum(len(r.split()) for r in refs)


def wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Corpus WER over normalised text; pairs whose normalised reference is empty are dropped."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    return wer_normalized([normalize(r) for r in references], [normalize(h) for h in hypotheses])[0]
