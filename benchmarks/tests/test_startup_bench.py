"""`python -m benchmarks.startup`: a fresh `specasr transcribe` split into phases."""

from __future__ import annotations

import pytest

from benchmarks.startup import PHASES, fw_phases, measure, phases


def test_the_phases_split_the_wall_the_parent_saw():
    """The child's marks and timers give the phases in between; what the parent saw outside
    the child's clock is the interpreter's start (at most a bare interpreter's) and the exit."""
    marks = {"start": 10.0, "import torch": 11.25, "import specasr": 11.4, "main end": 13.4}
    spent = {"load": 0.75, "draft": 0.25, "encode": 0.6}
    got = phases(wall=3.5, bare=0.05, marks=marks, spent=spent)
    assert list(got) == list(PHASES)
    want = {
        "python": 0.05,
        "import torch": 1.25,
        "import specasr": 0.15,
        "load target": 0.5,
        "load draft": 0.25,
        "encode": 0.6,
        "rest of run": 0.65,
        "exit": 0.05,
    }
    assert got == pytest.approx(want)
    assert sum(got.values()) == pytest.approx(3.5)


def test_faster_whispers_phases_split_its_wall_alike():
    marks = {"start": 5.0, "import": 5.2, "load": 5.65, "main end": 7.0}
    got = fw_phases(wall=2.3, bare=0.05, marks=marks)
    want = {"python": 0.05, "import": 0.2, "load": 0.45, "transcribe": 1.35, "exit": 0.25}
    assert got == pytest.approx(want) and sum(got.values()) == pytest.approx(2.3)


@pytest.mark.slow  # base and its draft, loaded in fresh processes
def test_a_fresh_exact_run_is_split_into_phases_that_add_up(tmp_path):
    from importlib.resources import files

    clip = str(files("specasr") / "assets" / "example.wav")
    wall, medians = measure([clip, "--mode", "exact", "-o", str(tmp_path)], repeats=1)
    assert sum(medians.values()) == pytest.approx(wall, rel=1e-6)
    assert all(s >= 0 for s in medians.values()), medians
    for busy in ("import torch", "load target", "load draft", "encode", "rest of run"):
        assert medians[busy] > 0.01, medians  # each really measured something
    assert (tmp_path / "example.txt").is_file()
