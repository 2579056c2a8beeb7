"""specasr: Whisper transcription with exact speculative decoding.

    from specasr import load_pair, transcribe, DecodeOptions, TranscribeOptions
    from specasr import WhisperModel  # faster-whisper's call shape (specasr/model.py)

The names below are imported lazily, on first use, so `import specasr` (and the CLI's
`--help`) stays fast.

Layout: `models/` (loading, conversion, the draft), `decode/` (the loop and its policies),
`longform/` (windows and strategies), `cpu/` (the CPU fast path), `cli/`, `eval/` (and
`specasr bench`'s timing); `specasr.kernels` (the verifiers), `specasr.apps` and
`specasr.recipes` map the repository's `kernels/`, `apps/` and `recipes/` folders. The
benchmarks and probes are not in the package: `benchmarks/`, run from a checkout.
"""

from __future__ import annotations

import importlib
from pathlib import Path

__version__ = "0.1.0"

_EXPORTS = {
    "load_pair": "specasr.models.loading",
    "ModelPair": "specasr.models.loading",
    "transcribe": "specasr.transcription",
    "transcribe_clip": "specasr.transcription",
    "DecodeOptions": "specasr.options",
    "TranscribeOptions": "specasr.options",
    "DecodeResult": "specasr.results",
    "Segment": "specasr.results",
    "TranscriptionInfo": "specasr.results",
    "WhisperModel": "specasr.model",
}
__all__ = sorted(_EXPORTS)

# In a source checkout, `specasr.kernels`, `.apps` and `.recipes` live in top-level folders
# that the installed package maps into `specasr/` (pyproject's package-dir). Running from the
# checkout imports this directory instead of the installed package, so give it the same
# mapping: the repository root joins the package path, after specasr/ itself.
_ROOT = Path(__file__).resolve().parent.parent
_MAPPED = ("kernels", "apps", "recipes")
if (
    not (Path(__file__).resolve().parent / "kernels").is_dir()
    and (_ROOT / "pyproject.toml").is_file()
    and all((_ROOT / name / "__init__.py").is_file() for name in _MAPPED)
):
    __path__.append(str(_ROOT))


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from specasr.backends.process import collector_paused  # no torch

    with collector_paused():  # the first name imports torch: see specasr.backends.process
        return getattr(importlib.import_module(_EXPORTS[name]), name)
