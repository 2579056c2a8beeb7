"""`python -m benchmarks.gpu` runs on a CPU as it will on a lent GPU (issue 21)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from benchmarks.gpu import main, token_alpha


@pytest.mark.slow
def test_gpu_bench_runs_every_loop_and_checks_tokens():
    args = [
        "--device",
        "cpu",
        "--batch",
        "1,2",
        "--clips",
        "2",
        "--repeats",
        "1",
        "--gamma",
        "3",
        "--breakdown",
        "--transcribe",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = [
        line.split(" | ")
        for line in result.output.splitlines()
        if line.startswith("| 1 ") or line.startswith("| 2 ")
    ]
    loops = {(r[0].strip("| "), r[1]) for r in rows}
    for b in ("1", "2"):
        loop_names = ("ar", "exact", "sigmoid", "device-ar", "device-exact γ3", "device-exact adaptive γ3…8")
        assert {(b, n) for n in loop_names} <= loops
    assert all(r[-1].strip(" |") == "yes" for r in rows), result.output  # every loop gave ar's tokens
    alphas = [float(r[7]) for r in rows if r[1] == "device-exact γ3"]
    assert all(0.3 < a <= 1.0 for a in alphas)  # the packaged draft, not a random one
    tokens = {r[1]: round(float(r[2]) * float(r[6])) for r in rows if r[0] == "| 1"}  # seconds × tokens/s
    assert tokens["ar"] > 32  # B = 1 decodes both clips in turn (the first alone has 27 tokens)
    c = re.search(r"draft pass over 1 token \| \d+ µs \(c = ([0-9.]+)\)", result.output)
    assert c and 0 < float(c.group(1)) < 1, result.output  # the breakdown, one table per batch size
    assert result.output.count("best fixed-γ speedup at this α, c, v") == 2
    loops = re.findall(
        r"^\| (\w+ (?:host|device) loop) \| [0-9.]+ \| [0-9.]+× \| (yes|NO) \|$", result.output, re.M
    )
    assert len(loops) == 4 and all(same == "yes" for _, same in loops), result.output  # transcribe_clip


def test_token_alpha_solves_the_expected_accepted_count():
    # α + α² + α³ = 1 at γ = 3: α ≈ 0.5437; done rows (-1) are left out
    alpha = token_alpha([[1, -1], [0, 2]], [3, 3])
    assert alpha == pytest.approx(0.5437, abs=1e-3)
    assert token_alpha([[3]], [3]) == 0.999  # every proposal kept: α at the top of the range
