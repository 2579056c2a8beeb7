"""benchmarks/calibration.py: calibrates, then decodes the same windows under the built-in tables,
under the measured curves and target-only, with the same tokens."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from benchmarks import calibration as bench


@pytest.mark.slow
def test_backoff_on_both_curves_is_timed_beside_target_only_with_the_same_tokens(
    one_clip_data, tmp_path, monkeypatch
):
    monkeypatch.setenv("SPECASR_CACHE", str(tmp_path))
    args = ["--audio", str(one_clip_data / "*.wav"), "--repeats", "1", "--batch", "2", "--files", "2"]
    result = CliRunner().invoke(bench.main, args)
    assert result.exit_code == 0, result.output
    assert "calibration at 1, 2 rows" in result.output
    assert len([r for r in result.output.splitlines() if r.startswith(("| 1 |", "| 2 |"))]) == 2
    rows = [r.split("|") for r in result.output.splitlines() if r.startswith(("| target", "| exact"))]
    assert [r[1].strip() for r in rows] == [
        "target only",
        "exact, backoff on the built-in tables",
        "exact, backoff on the measured curves",
    ]
    assert all(r[6].strip() == "yes" for r in rows)  # every configuration: target-only's tokens
    assert int(rows[0][5]) == 0 and int(rows[1][5]) > 0  # target-only takes no draft step
    assert list((tmp_path / "calibration").glob("*.json"))  # stored where the cache is
