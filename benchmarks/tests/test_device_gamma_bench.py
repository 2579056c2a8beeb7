"""`python -m benchmarks.device_gamma` runs on a CPU as it will on a lent GPU."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from benchmarks.device_gamma import main


@pytest.mark.slow
def test_device_gamma_times_every_policy_against_autoregressive():
    args = ["--device", "cpu", "--gammas", "2,4", "--repeats", "1", "--workloads", "clips"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    rows = [line.strip("| ").split(" | ") for line in lines if line.startswith("| clips ")]
    names = [r[1] for r in rows]
    assert names == [
        "autoregressive",
        "exact, fixed γ 2",
        "exact, fixed γ 4",
        "exact, adaptive γ 3…8",
        "exact, adaptive γ 5…8",
    ]
    assert rows[0][3] == "1.00×" and all(float(r[2]) > 0 for r in rows)
    assert all(r[4] == "yes" for r in rows), result.output  # every policy gave autoregressive's tokens


def test_device_gamma_refuses_an_unknown_workload():
    result = CliRunner().invoke(main, ["--device", "cpu", "--workloads", "podcast"])
    assert result.exit_code == 2 and "podcast" in result.output
