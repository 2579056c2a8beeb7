"""Code comments and docstrings say why, not when or where: no references to past work
rounds (session N, turn-N, round N, issue N), no development machines (CPU models, GPU
names, "dev box"). Measured numbers belong in docs/benchmarks.md, which the code points to.

Every .py/.c/.cpp file under specasr/, kernels/, apps/ and recipes/ is scanned line by line."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("specasr", "kernels", "apps", "recipes")
SUFFIXES = {".py", ".c", ".cpp", ".h"}

FORBIDDEN = {
    "work session": r"\bsessions? \d+",
    "work turn": r"\bturn-\d+",
    "work round": r"\brounds? \d+\b(?! ?(?:s|ms|bytes?|tokens?|rows?)\b)",
    "issue number": r"\bissue #?\d+",
    "CPU model": r"\bXeon\b|\bZen ?\d\b|Emerald Rapids|Sapphire Rapids|\bEPYC\b",
    "development machine": r"\bdev (?:box|cpu|machine)\b|\b\d+-core\b",
    "GPU model": r"\b[AH][1-2]00\b",
}
_PATTERNS = [(name, re.compile(p, re.IGNORECASE)) for name, p in FORBIDDEN.items()]


def scan_text(text: str, where: str = "<text>") -> list[str]:
    """`where:line: kind: text` for every line of `text` that matches a forbidden pattern."""
    found = []
    for i, line in enumerate(text.splitlines(), 1):
        for name, pattern in _PATTERNS:
            if pattern.search(line):
                found.append(f"{where}:{i}: {name}: {line.strip()}")
    return found


def source_files() -> list[Path]:
    files = []
    for folder in FOLDERS:
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in SUFFIXES and p.is_file()]
    return files


def scan_tree() -> list[str]:
    found = []
    for path in source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        found += scan_text(text, str(path.relative_to(ROOT)))
    return found


def test_the_scan_covers_the_sources():
    names = {str(p.relative_to(ROOT)) for p in source_files()}
    assert "specasr/backends/process.py" in names and "kernels/reference.py" in names
    assert any(n.startswith("apps/") for n in names) and any(n.startswith("recipes/") for n in names)


def test_no_work_round_references_or_machine_names_in_code():
    found = scan_tree()
    assert found == [], "\n".join(found)


def test_the_scanner_reports_a_planted_line(tmp_path):
    planted = (
        "def f():\n"
        "    return 1  # measured on the 2-core Xeon, session 23\n"
        "x = round(3.5)  # rounds half to even\n"
        "# turn-3 and round 5 changed this; see issue 21, run on an H200\n"
    )
    found = scan_text(planted, "planted.py")
    assert found[0].startswith("planted.py:2: ")
    kinds = {line.split(": ")[1] for line in found}
    assert kinds == {"work session", "work turn", "work round", "issue number", "CPU model",
                     "development machine", "GPU model"}  # fmt: skip
    assert not any(line.startswith("planted.py:3:") for line in found)  # round(…) is not a round
    assert scan_text("pause over 3 s; 30 s windows; base's 51865 × 512 head") == []
