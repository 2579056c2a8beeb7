"""Shared fixtures. Keep these generic: other test modules build on them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import pytest

DATA = Path(__file__).parent / "data"

# The interpreted-Triton tests need TRITON_INTERPRET=1 before triton is imported: they run in
# child processes started by test_kernels_triton.py, which set it, and are not collected here.
collect_ignore = [] if os.environ.get("TRITON_INTERPRET") == "1" else ["test_kernels_interpreted.py"]


class Clip(NamedTuple):
    id: str
    path: Path  # 16 kHz mono PCM_16 wav
    text: str  # reference transcript, lower case, no punctuation


@pytest.fixture(scope="session")
def librivox() -> list[Clip]:
    """The LibriVox clips in tests/data, with references from transcripts.txt."""
    clips = []
    for line in (DATA / "transcripts.txt").read_text().splitlines():
        if not line.strip():
            continue
        clip_id, text = line.split(maxsplit=1)
        clips.append(Clip(clip_id, DATA / f"{clip_id}.wav", text))
    assert clips and all(c.path.is_file() for c in clips), "tests/data is incomplete"
    return clips


@pytest.fixture(scope="session")
def base_pair():
    """The packaged `base` target with no draft (attach drafts with `with_self_draft`)."""
    from specasr.models.loading import load_pair

    return load_pair("base", None, device="cpu")


@pytest.fixture(scope="session")
def tiny_en_pair():
    from specasr.models.loading import load_pair

    return load_pair("tiny.en", None, device="cpu")


def with_self_draft(pair, k: int):
    """The same target with `self:k` as its draft (no weights copied)."""
    from dataclasses import replace

    from specasr.models.loading import self_draft

    return replace(pair, draft=self_draft(pair.target, k), shared_encoder=True, draft_name=f"self:{k}")


@pytest.fixture(scope="session")
def librivox_mels(librivox):
    """Log-Mel windows [1, 80, 3000] of each LibriVox clip, keyed by clip id."""
    from specasr.audio import load_audio
    from specasr.features import log_mel_window

    return {c.id: log_mel_window(load_audio(c.path), n_mels=80) for c in librivox}
