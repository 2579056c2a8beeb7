"""benchmarks/batch_costs.py: the measured batch cost curves, beside the stored table and as a
literal that reads back as the same curves."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from benchmarks import batch_costs
from benchmarks.speedup import StepCosts
from specasr.decode.gamma import SpeculationCost, cpu_batch_costs


def test_step_costs_become_a_cost_curve_shown_beside_the_stored_one_and_as_python():
    measured = {
        2: batch_costs.measured_cost(StepCosts({1: 10.0, 2: 12.0, 3: 15.0}, draft=2.0)),
        16: batch_costs.measured_cost(StepCosts({1: 40.0, 2: 60.0, 3: 90.0}, draft=16.0)),
    }
    assert measured[2].c == pytest.approx(0.2)
    assert measured[2].verify == pytest.approx({1: 1.0, 2: 1.2, 3: 1.5})
    stored = {2: SpeculationCost(0.25, {1: 1.0, 2: 1.1, 3: 1.3})}
    rows = batch_costs.cost_table(measured, stored, [1, 2, 3]).splitlines()[2:]
    assert rows[0] == "| 2 | 0.200 | 1.00 | 1.20 | 1.50 | 0.250 | 1.00 | 1.10 | 1.30 |"
    assert rows[1] == "| 16 | 0.400 | 1.00 | 1.50 | 2.25 | – | – | – | – |"  # nothing stored for 16
    back = eval(batch_costs.cost_literal(measured), {"SpeculationCost": SpeculationCost})  # noqa: S307
    assert back.keys() == measured.keys()
    for b, cost in measured.items():
        assert back[b].c == pytest.approx(cost.c, abs=1e-3)
        assert back[b].verify == pytest.approx(cost.verify, abs=1e-2)


def test_base_with_its_draft_is_measured_at_each_batch_size(one_clip_data):
    args = ["--rows", "1,2", "--max-k", "2", "--repeats", "1", "--data", str(one_clip_data)]
    result = CliRunner().invoke(batch_costs.main, args)
    assert result.exit_code == 0, result.output
    rows = [r for r in result.output.splitlines() if r.startswith(("| 1 |", "| 2 |"))]
    assert len(rows) == 2 and all(r.split("|")[3].strip() == "1.00" for r in rows)  # v(1) = 1
    assert "    2: SpeculationCost(" in result.output  # the literal names each measured size
    stored = cpu_batch_costs(int8_target=False)[2].c  # an fp32 target's table (not int8's)
    assert stored != cpu_batch_costs(int8_target=True)[2].c
    assert rows[1].split("|")[5].strip() == f"{stored:.3f}"  # beside the stored B = 2 curve (c)


@pytest.mark.parametrize("rows", ["two", "0", ""])
def test_batch_sizes_that_are_not_positive_integers_are_a_usage_error(rows):
    result = CliRunner().invoke(batch_costs.main, ["--rows", rows])
    assert result.exit_code == 2
    assert "--rows" in result.output or "at least 1" in result.output
