"""Where specasr keeps what it derives from models (converted weights, tokenizer tables),
and how an entry is stored. Imports neither torch nor a model, so a front end can use it
before loading anything.

Every entry is keyed by the content it was derived from, so a stale entry is never read, and
written whole (a temporary file renamed into place), so a reader never sees half of one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def default_cache_root() -> Path:
    """$SPECASR_CACHE, else $XDG_CACHE_HOME/specasr, else ~/.cache/specasr."""
    if env := os.environ.get("SPECASR_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "specasr"


def store(path: Path, data: bytes) -> None:
    """Writes `data` to `path` whole: a temporary file of its own beside it (unique per
    writer, threads included), renamed into place. Concurrent writers of one key write the
    same bytes, so either rename may win."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
