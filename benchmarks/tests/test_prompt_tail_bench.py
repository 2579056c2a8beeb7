"""benchmarks/prompt_tail.py: one row per held-out source, one α̂ cell per prompt length, on a
corpus manifest like `specasr distill corpus` writes (here: the LibriVox clips as one source)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from conftest import write_corpus

from benchmarks import prompt_tail


def _corpus(root: Path) -> Path:
    clips = sorted(Path("tests/data").glob("sense*.wav"))[:3]
    return write_corpus(root, [(clip, "librivox:en", None) for clip in clips])


def test_parse_keeps():
    assert prompt_tail.parse_keeps("all, 8,32") == [None, 8, 32]


def test_the_table_has_a_cell_per_prompt_length(tmp_path):
    corpus = _corpus(tmp_path / "heldout")
    args = ["--corpus", str(corpus), "--per-source", "3", "--keeps", "all,4"]
    result = CliRunner().invoke(prompt_tail.main, args)
    assert result.exit_code == 0, result.output
    row = next(r for r in result.output.splitlines() if r.startswith("| librivox:en"))
    cells = [c.strip() for c in row.strip("|").split("|")][3:]
    assert len(cells) == 2 and all(0 < float(c.split()[0]) <= 1 for c in cells)
    assert "mean α̂ over 1 sources" in result.output


def test_no_matching_source_is_a_usage_error(tmp_path):
    corpus = _corpus(tmp_path / "heldout")
    result = CliRunner().invoke(prompt_tail.main, ["--corpus", str(corpus), "--sources", "fillets"])
    assert result.exit_code == 2 and "no source" in result.output
