"""benchmarks/draft_rows.py: the reduced-row and full-row paths of the packaged draft make the
same passes, and the A/B table has both strategies."""

from __future__ import annotations

from click.testing import CliRunner

from benchmarks import draft_rows


def test_the_ab_table_reports_both_strategies_with_the_same_passes(one_clip_data):
    data = one_clip_data
    result = CliRunner().invoke(draft_rows.main, ["--repeats", "1", "--data", str(data)])
    assert result.exit_code == 0, result.output
    assert "same passes and tokens on both paths: yes" in result.output
    rows = [r for r in result.output.splitlines() if r.startswith(("| sequential", "| chunked"))]
    assert len(rows) == 2 and all(r.count("×") == 3 for r in rows)


def test_a_draft_without_a_reduced_vocabulary_is_refused():
    result = CliRunner().invoke(draft_rows.main, ["--draft", "tiny", "--repeats", "1"])
    assert result.exit_code != 0
