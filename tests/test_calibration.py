"""specasr.decode.calibration: speculation cost curves measured on the machine that decodes,
stored in the cache per CPU, threads and models, read back by every later process, and what the
backoff γ policy makes of them (a curve under which speculation cannot pay: target-only)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from tiny_pairs import random_tiny_pair

import specasr.decode.loop as loop
from specasr.decode import calibration
from specasr.decode.gamma import CPU_COST, SpeculationCost
from specasr.options import DecodeOptions

CHEAP = SpeculationCost(0.01, {k: 1.0 for k in range(1, 9)})  # speculation pays at almost any α
HOPELESS = SpeculationCost(1.2, {1: 1.0, 2: 1.3, 3: 1.6, 4: 1.9})  # a draft step dearer than a target step


@pytest.fixture(scope="module")
def pair():
    return random_tiny_pair(seed=11)


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A cache of this test's own, calibration on (auto), and a fresh process's memory."""
    monkeypatch.setenv("SPECASR_CALIBRATE", "auto")
    monkeypatch.setenv("SPECASR_CACHE", str(tmp_path))
    monkeypatch.setattr(calibration, "_READ", {})
    return tmp_path


@pytest.fixture
def measures(monkeypatch):
    """Counts the measurements `measured_costs` starts (each size list), kept short."""
    calls: list[tuple[int, ...]] = []
    real = calibration.measure

    def counted(pair, rows, **_):
        calls.append(tuple(rows))
        return real(pair, rows, max_k=4, repeats=1)

    monkeypatch.setattr(calibration, "measure", counted)
    return calls


@pytest.fixture
def threads():
    """Restores torch's thread count after a test that changes it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_measured_curves_are_relative_to_one_target_step_and_never_fall_with_k(pair):
    sizes = calibration.measure(pair, rows=(1, 2, 4), max_k=4, repeats=2)
    assert list(sizes) == [1, 2, 4]
    for cost in sizes.values():
        assert list(cost.verify) == [1, 2, 3, 4] and cost.verify[1] == 1.0
        assert all(cost.verify[k] <= cost.verify[k + 1] for k in (1, 2, 3))
        assert cost.c > 0


def test_a_first_use_measures_and_stores_and_a_later_process_reads_without_measuring(pair, cache, measures):
    costs = calibration.measured_costs(pair, 1)
    assert measures == [(1,)] and costs.batch == {}
    assert calibration.measured_costs(pair, 1) == costs and measures == [(1,)]  # this process: memory
    calibration._READ.clear()  # a later process: the file
    assert calibration.measured_costs(pair, 1) == costs and measures == [(1,)]
    path = calibration.cache_path(calibration.calibration_key(pair))
    assert path.parent == cache / "calibration"
    assert json.loads(path.read_text())["key"]["threads"] == torch.get_num_threads()


def test_a_batch_measures_only_the_sizes_it_lacks_and_is_judged_by_them(pair, cache, measures):
    single = calibration.measured_costs(pair, 1).single
    costs = calibration.measured_costs(pair, 5)  # 5 rows, then fewer as they finish: sizes 1, 2, 4
    assert measures == [(1,), (2, 4)]
    assert costs.single == single and set(costs.batch) == {2, 4}
    calibration._READ.clear()
    assert calibration.measured_costs(pair, 3).batch == {2: costs.batch[2]} and len(measures) == 2


def test_cached_reads_but_never_measures_and_off_reads_nothing(pair, cache, measures, monkeypatch):
    monkeypatch.setenv("SPECASR_CALIBRATE", "cached")
    assert calibration.measured_costs(pair, 1) is None and measures == []  # nothing stored: the tables
    calibration.write(calibration.calibration_key(pair), {1: CHEAP})
    calibration._READ.clear()
    assert calibration.measured_costs(pair, 1).single == CHEAP
    assert calibration.measured_costs(pair, 2) is None and measures == []  # no B = 2 curve: the tables
    monkeypatch.setenv("SPECASR_CALIBRATE", "off")
    assert calibration.measured_costs(pair, 1) is None
    monkeypatch.setenv("SPECASR_CALIBRATE", "sometimes")
    with pytest.raises(ValueError, match="SPECASR_CALIBRATE"):
        calibration.measured_costs(pair, 1)


def test_a_damaged_file_is_measured_again(pair, cache, measures):
    path = calibration.cache_path(calibration.calibration_key(pair))
    path.parent.mkdir(parents=True)
    path.write_text('{"key": {"version": 1}, "sizes"')
    assert calibration.measured_costs(pair, 1) is not None and measures == [(1,)]
    assert json.loads(path.read_text())["key"] == calibration.calibration_key(pair)


def test_curves_are_kept_apart_by_cpu_threads_compute_type_and_models(pair, monkeypatch, threads):
    here = calibration.cache_path(calibration.calibration_key(pair))
    torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)
    other_threads = calibration.cache_path(calibration.calibration_key(pair))
    monkeypatch.setattr(
        calibration, "cpu", lambda: {"model": "Neoverse-V2", "machine": "aarch64", "flags": ["sve"]}
    )
    other_cpu = calibration.cache_path(calibration.calibration_key(pair))
    other_models = calibration.cache_path(
        calibration.calibration_key(random_tiny_pair(seed=11, draft_layers=2))
    )
    assert len({here, other_threads, other_cpu, other_models}) == 4


EXACT = DecodeOptions(mode="exact")


def _decode(pair, options=EXACT):
    mel = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(4))  # [1, 80, 3000]
    return loop.decode(pair, mel, options)[0]


def test_another_cpus_curve_in_the_cache_decides_backoff_on_one_thread(pair, cache, monkeypatch, threads):
    """A cache holding the curves of a CPU unlike the dev box (here: an ARM server, one thread)
    is what the backoff policy reads there, not the built-in tables; under a curve where
    speculation cannot pay, the loop is target-only from the first step, with the same tokens."""
    monkeypatch.setenv("SPECASR_CALIBRATE", "cached")  # what is stored, never a measurement
    monkeypatch.setattr(
        calibration, "cpu", lambda: {"model": "Neoverse-V2", "machine": "aarch64", "flags": ["sve"]}
    )
    torch.set_num_threads(1)
    key = calibration.calibration_key(pair)
    built = []
    real = loop.make_policy
    monkeypatch.setattr(loop, "make_policy", lambda *a, **k: built.append(real(*a, **k)) or built[-1])

    calibration.write(key, {1: CHEAP})
    _decode(pair)
    assert built[-1].cost == CHEAP  # not CPU_COST
    calibration.write(key, {1: HOPELESS})
    calibration._READ.clear()
    hopeless = _decode(pair)
    assert built[-1].cost == HOPELESS
    ar = _decode(pair, DecodeOptions(mode="autoregressive"))
    assert hopeless.stats.draft_calls == 0
    assert hopeless.stats.target_calls == ar.stats.target_calls and hopeless.tokens == ar.tokens

    monkeypatch.setenv("SPECASR_CALIBRATE", "off")  # the built-in tables: the draft gets its first tries
    tables = _decode(pair)
    assert built[-1].cost == CPU_COST and tables.stats.draft_calls > 0 and tables.tokens == ar.tokens


@pytest.mark.slow
def test_base_with_its_draft_under_a_hopeless_curve_decodes_target_only(
    base_shipped, librivox, librivox_mels, base_ar, cache, monkeypatch, threads
):
    """The packaged pair on one thread, with a stored curve of a CPU where its draft cannot pay:
    no draft step at all, and base's greedy tokens."""
    monkeypatch.setenv("SPECASR_CALIBRATE", "cached")
    torch.set_num_threads(1)
    calibration.write(calibration.calibration_key(base_shipped), {1: HOPELESS})
    clip = librivox[0]
    result = loop.decode(base_shipped, librivox_mels[clip.id], DecodeOptions(mode="exact"))[0]
    assert result.stats.draft_calls == 0 and result.tokens == base_ar[clip.id].tokens
    monkeypatch.setenv("SPECASR_CALIBRATE", "off")  # the built-in tables: base's draft speculates
    shipped = loop.decode(base_shipped, librivox_mels[clip.id], DecodeOptions(mode="exact"))[0]
    assert shipped.stats.draft_calls > 0 and shipped.tokens == base_ar[clip.id].tokens


@pytest.mark.slow
def test_specasr_calibrate_measures_stores_and_prints_the_curves(cache, threads):
    from specasr.cli import main

    result = CliRunner().invoke(main, ["calibrate", "--rows", "1,2", "--repeats", "1", "--threads", "1"])
    assert result.exit_code == 0, result.output
    rows = [r for r in result.output.splitlines() if r.startswith(("| 1 |", "| 2 |"))]
    assert len(rows) == 2 and all(r.split("|")[3].strip() == "1.00" for r in rows)  # v(1) = 1
    assert "1 row: " in result.output and "2 rows: " in result.output  # break-even α per size
    stored = json.loads(next((cache / "calibration").glob("*.json")).read_text())
    assert stored["key"]["threads"] == 1 and set(stored["sizes"]) == {"1", "2"}


@pytest.mark.parametrize("rows", ["two", "0", ""])
def test_batch_sizes_that_are_not_positive_integers_are_a_usage_error(rows):
    from specasr.cli import main

    result = CliRunner().invoke(main, ["calibrate", "--rows", rows])
    assert result.exit_code == 2 and "--rows" in result.output
