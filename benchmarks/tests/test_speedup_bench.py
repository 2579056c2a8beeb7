"""speedup_bench's bounds, tested on their values: what the measured α̂, c and verification
curve allow (the bench report's own ratios: tests/test_bench.py)."""

from __future__ import annotations

import pytest

from benchmarks.speedup import Bounds, StepCosts, _bound_rows, _side_by_side, bounds, side_by_side_table
from specasr.decode.gamma import best_speedup
from specasr.stats import DecodeStats


def _bounds(curve: dict[int, float], **lf) -> Bounds:
    costs = StepCosts({k: 20.0 * v for k, v in curve.items()}, eager={1: 99.0}, draft=5.0)
    base = {"ar_decoder": 4.0, "ar_window": 0.0, "ar_wall": 4.0, "token_alpha": 0.85, "c": 0.25}
    return bounds(base | lf, costs.verify_curve(), goal=1.5, e2e_goal=1.2)


def test_without_per_window_work_or_encoder_the_phase_bound_is_the_loop_bound():
    curve = {k: 1.0 + 0.05 * (k - 1) for k in range(1, 9)}
    b = _bounds(curve)
    loop, g = best_speedup(0.85, 0.25, curve)
    assert (b.loop, b.loop_gamma) == (pytest.approx(loop), g)
    assert b.phase == pytest.approx(loop) and b.end_to_end == pytest.approx(loop)
    assert b.window_share == 0.0 and b.verify == pytest.approx(curve)


def test_shared_costs_dilute_the_bound_and_raise_what_a_goal_needs():
    curve = {k: 1.0 + 0.05 * (k - 1) for k in range(1, 9)}
    lean, heavy = _bounds(curve), _bounds(curve, ar_window=1.0, ar_wall=7.0)
    assert heavy.loop == pytest.approx(lean.loop)  # the loop itself does not see shared costs
    # D / (F + (D − F) / loop) with D = 4, F = 1; end to end W / (W − D + D / phase), W = 7
    phase = 4.0 / (1.0 + 3.0 / heavy.loop)
    assert heavy.phase == pytest.approx(phase)
    assert heavy.end_to_end == pytest.approx(7.0 / (3.0 + 4.0 / phase))
    assert heavy.window_share == pytest.approx(0.25)
    assert heavy.need_alpha > lean.need_alpha
    assert heavy.need_c < lean.need_c  # shared costs ask for a cheaper draft
    # at the α̂ (and the c) a goal needs, the phase bound reaches that goal
    for b in (lean, heavy):
        at_alpha = _bounds(curve, ar_window=b.window_s, ar_wall=4.0, token_alpha=b.need_alpha)
        assert at_alpha.phase == pytest.approx(1.5, abs=1e-3)
        at_c = _bounds(curve, ar_window=b.window_s, ar_wall=4.0, c=b.need_c)
        assert at_c.phase == pytest.approx(1.5, abs=1e-3)


def test_a_goal_no_alpha_reaches_is_called_unreachable():
    steep = {k: 1.0 + 0.6 * (k - 1) for k in range(1, 9)}  # verification far dearer than a step
    b = _bounds(steep, ar_window=2.0)
    assert b.need_alpha is None and b.need_c is None
    assert _bounds(steep, ar_window=2.0, token_alpha=0.999).phase < 1.5  # not even at α̂ ≈ 1
    rows = dict(_bound_rows(b))  # the table says so in words
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


@pytest.mark.slow  # tiny.en: the clips, the step costs and two long-form decodes
def test_the_long_form_part_runs_on_a_corpus_source_in_its_language(tmp_path, librivox):
    from click.testing import CliRunner
    from conftest import write_corpus

    from benchmarks.speedup import main

    rows = [(c.path, "librivox:en" if i < 2 else "other:en", c.text) for i, c in enumerate(librivox[:3])]
    corpus = str(write_corpus(tmp_path, rows))
    args = ["--model", "tiny.en", "--draft", "self:2", "--repeats", "1", "--corpus", corpus]
    result = CliRunner().invoke(main, [*args, "--source", "librivox:en", "--per-source", "2"])
    assert result.exit_code == 0, result.output
    assert f"### 2 windows of librivox:en ({corpus}), sequential strategy" in result.output
    seconds = sum(sf_seconds(c.path) for c in librivox[:2]) + 2.0  # each window, then 1 s of silence
    assert f"| audio | {seconds:.1f} s |" in result.output  # the joined windows, not the fixture
    assert "| tokens identical to autoregressive | yes |" in result.output
    missing = CliRunner().invoke(main, [*args, "--source", "fillets:nl"])
    assert missing.exit_code == 2 and "no windows of 'fillets:nl'" in missing.output


def sf_seconds(path) -> float:
    import soundfile as sf

    return sf.info(str(path)).duration
