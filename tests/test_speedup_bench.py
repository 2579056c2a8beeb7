"""speedup_bench's bound rows: what the measured α̂, c and verification curve allow."""

from __future__ import annotations

import pytest

from specasr.decode.gamma import best_speedup
from specasr.decode.stats import DecodeStats
from specasr.research.speedup import StepCosts, _bound_rows, _side_by_side, side_by_side_table


def _rows(curve: dict[int, float], **lf) -> dict[str, str]:
    costs = StepCosts({k: 20.0 * v for k, v in curve.items()}, transformers={1: 99.0}, draft=5.0)
    base = {"ar_decoder": 4.0, "ar_window": 0.0, "ar_wall": 4.0, "token_alpha": 0.85, "c": 0.25}
    return dict(_bound_rows(base | lf, costs.verify_curve(), goal=1.5, e2e_goal=1.2))


LOOP = "best fixed-γ loop speedup at this α̂, c and v (gamma.best_speedup)"
NEED_C = "c for 1.5× decoder phase at this α̂ and v"


def _x(cell: str) -> float:
    return float(cell.split("×")[0])


def test_without_per_window_work_or_encoder_the_phase_bound_is_the_loop_bound():
    curve = {k: 1.0 + 0.05 * (k - 1) for k in range(1, 9)}
    rows = _rows(curve)
    loop = best_speedup(0.85, 0.25, curve)[0]
    assert _x(rows[LOOP]) == pytest.approx(loop, abs=0.005)
    assert _x(rows["best fixed-γ decoder-phase speedup at this α̂, c and v"]) == pytest.approx(loop, abs=0.005)
    assert _x(rows["best fixed-γ end-to-end speedup at this α̂, c and v"]) == pytest.approx(loop, abs=0.005)


def test_shared_costs_dilute_the_bound_and_raise_what_a_goal_needs():
    curve = {k: 1.0 + 0.05 * (k - 1) for k in range(1, 9)}
    lean, heavy = _rows(curve), _rows(curve, ar_window=1.0, ar_wall=7.0)
    loop = _x(heavy[LOOP])
    # D / (F + (D − F) / loop) with D = 4, F = 1; end to end W / (W − D + D / phase), W = 7
    phase = 4.0 / (1.0 + 3.0 / loop)
    assert _x(heavy["best fixed-γ decoder-phase speedup at this α̂, c and v"]) == pytest.approx(
        phase, abs=0.005
    )
    e2e = 7.0 / (3.0 + 4.0 / phase)
    assert _x(heavy["best fixed-γ end-to-end speedup at this α̂, c and v"]) == pytest.approx(e2e, abs=0.005)
    key = "α̂ for 1.5× decoder phase at this c and v"
    assert float(heavy[key]) > float(lean[key])
    assert float(heavy[NEED_C]) < float(lean[NEED_C])  # shared costs ask for a cheaper draft


def test_a_goal_no_alpha_reaches_is_called_unreachable():
    steep = {k: 1.0 + 0.6 * (k - 1) for k in range(1, 9)}  # verification far dearer than a step
    rows = _rows(steep, ar_window=2.0)
    assert rows["α̂ for 1.5× decoder phase at this c and v"] == "unreachable"


def _run(wall: float, decoder: float, tokens: list, calls: int) -> tuple:
    return (
        wall,
        tokens,
        DecodeStats(decoder_s=decoder, target_calls=calls, emitted=3 * calls, row_steps=calls),
    )


def test_side_by_side_pairs_each_configuration_with_the_same_autoregressive_runs():
    ar = [_run(8.0, 4.0, [[1]], 100), _run(10.0, 6.0, [[1]], 100), _run(6.0, 3.0, [[1]], 100)]
    fast = [_run(4.0, 2.0, [[1]], 40), _run(5.0, 2.0, [[1]], 40), _run(5.0, 3.0, [[1]], 40)]
    row = _side_by_side("fast", ar, fast)
    assert row["paired_wall"] == pytest.approx(2.0)  # median of 2.0, 2.0, 1.2
    assert row["paired_decoder"] == pytest.approx(2.0)  # median of 2.0, 3.0, 1.0
    assert row["decoder_spread"] == pytest.approx((1.0, 3.0))  # the lowest and highest pair
    assert row["wall_spread"] == pytest.approx((1.2, 2.0))
    assert row["target_calls"] == 40 and row["tokens_per_call"] == 3.0 and row["identical"]
    wrong = _side_by_side("wrong", ar, [_run(4.0, 2.0, [[2]], 40)] + fast[1:])
    assert not wrong["identical"]
    table = side_by_side_table([row, wrong])
    assert "| fast | 2.00× | 1.00× – 3.00× | 2.00× |" in table and table.rstrip().endswith("| no |")
