"""Where specasr keeps what it derives from models (converted weights, tokenizer tables),
and how an entry is stored. Imports neither torch nor a model, so a front end can use it
before loading anything.

Every entry is keyed by the content it was derived from, so a stale entry is never read, and
written whole (a temporary file renamed into place), so a reader never sees half of one.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_root() -> Path:
    """$SPECASR_CACHE, else $XDG_CACHE_HOME/specasr, else ~/.cache/specasr."""
    if env := os.environ.get("SPECASR_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "specasr"


def store(path: Path, data: bytes) -> None:
    """Writes `data` to `path` whole: a temporary file beside it, renamed into place. A
    concurrent writer of the same key writes the same bytes, so either rename may win."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
