"""The lab's tests share the product tests' fixtures, helpers and slow tier: tests/ goes on
sys.path (for `from conftest import write_corpus`, `from tiny_pairs import ...`) and
tests/conftest.py's fixtures and tier hook are re-exported here, for this folder."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import conftest as shared  # noqa: E402  tests/conftest.py (pytest's own module when tests/ is collected too)
from conftest import (  # noqa: E402, F401  fixtures, used by name
    base_pair,
    librivox,
    librivox_mels,
    one_clip_data,
    tiny_en_pair,
)

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """tests/conftest.py's tiers for this folder's tests (if tests/ is collected too, its hook
    has marked them already)."""
    mine = [i for i in items if HERE in Path(i.path).resolve().parents]
    shared.pytest_collection_modifyitems(config, [i for i in mine if i.get_closest_marker("slow") is None])
