"""Models: loading a target and its draft as one `ModelPair` (`loading`), CTranslate2
conversion (`convert`), the distilled draft (`draft`) and the Whisper decoder layer they
share (`layers`); where derived files are cached (`cache`, no torch: the tokenizer uses it).

`from specasr.models import load_pair` works; the names are resolved lazily, so importing
a submodule does not load the others.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ModelPair": "loading",
    "PRESETS": "loading",
    "list_presets": "loading",
    "load_pair": "loading",
    "offline_files": "loading",
    "packaged_draft": "loading",
    "self_draft": "loading",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
