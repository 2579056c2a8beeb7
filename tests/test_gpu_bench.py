"""`python -m specasr.research.gpu` runs on a CPU as it will on a lent GPU (issue 21)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from specasr.research.gpu import main


@pytest.mark.slow
def test_gpu_bench_runs_every_loop_and_checks_tokens():
    args = ["--device", "cpu", "--batch", "1,2", "--clips", "1", "--repeats", "1", "--gamma", "3"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = [
        line.split(" | ")
        for line in result.output.splitlines()
        if line.startswith("| 1 ") or line.startswith("| 2 ")
    ]
    loops = {(r[0].strip("| "), r[1]) for r in rows}
    for b in ("1", "2"):
        assert {(b, n) for n in ("ar", "exact", "sigmoid", "device-ar", "device-exact γ3")} <= loops
    assert all(r[-1].strip(" |") == "yes" for r in rows), result.output  # every loop gave ar's tokens
    alphas = [float(r[7]) for r in rows if r[1] == "device-exact γ3"]
    assert all(0.3 < a <= 1.0 for a in alphas)  # the packaged draft, not a random one
