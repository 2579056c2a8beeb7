"""`python -m benchmarks.busy_bound`: its documented command parses, the rounds hold the asked
products and serial share, a child process times its work, and the table reads gains and
slowdowns against the right references."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.busy_bound import ROUND, rounds, table, ways
from benchmarks.docs_check import check_command


def test_the_documented_command_parses():
    assert check_command("python -m benchmarks.busy_bound --repeats 3 --products 240") is None


@pytest.mark.parametrize(
    ("serial", "expect"), [(0.0, (0, 20)), (0.3, (6, 14)), (0.6, (12, 8)), (1.0, (20, 0))]
)
def test_rounds_split_each_round_by_the_serial_share(serial, expect):
    plan = rounds(240, serial)
    assert plan == [expect] * (240 // ROUND) and sum(s + p for s, p in plan) == 240


def test_every_way_has_its_one_thread_reference_first():
    names = [w.name for w in ways()]
    assert names[0] == "one thread" and len(set(names)) == len(names)
    assert {w.kind for w in ways()} == {"one", "balanced", "split"}


@pytest.mark.parametrize("kind", ["balanced", "split"])
def test_a_child_reports_the_seconds_of_its_work(kind):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.busy_bound",
            "--child",
            kind,
            "--serial",
            "0.5",
            "--products",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert float(run.stdout.strip().splitlines()[-1]) > 0


def test_the_table_gives_gain_against_one_thread_and_slowdown_against_quiet():
    seconds = {
        "one thread": {0: [2.0, 2.0, 2.0], 1: [2.0, 2.0, 2.1], 2: [3.0, 3.0, 3.0]},
        "balanced, s = 0.0": {0: [1.0, 1.1, 0.9], 1: [1.5, 1.4, 1.6], 2: [2.0, 2.0, 2.0]},
    }
    lines = table(seconds).splitlines()
    assert len(lines) == 4
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    assert cells == ["balanced, s = 0.0", "2.00×", "1.00", "1.50", "1.50×", "2.00", "2.00×"]
    assert [c.strip() for c in lines[2].strip("|").split("|")][1] == "1.00×"
