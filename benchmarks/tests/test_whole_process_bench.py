"""`python -m benchmarks.whole_process`: which commands it times, and that the batched
rows run as written."""

from __future__ import annotations

import subprocess
import sys
from importlib.resources import files
from importlib.util import find_spec
from pathlib import Path

import pytest
from click.testing import CliRunner

from benchmarks.whole_process import (
    BATCHED,
    FW_SCRIPT,
    Row,
    beside_busy,
    busy_rows,
    busy_table,
    chosen,
    ct2_dir,
    rows_for,
    spinning,
    without,
)
from specasr.cli import main

EXAMPLE = str(files("specasr") / "assets" / "example.wav")


def test_batched_rows_are_added_only_when_asked():
    plain = rows_for("x.wav", Path("ct2"), 2)
    both = rows_for("x.wav", Path("ct2"), 2, batched=True)
    assert not any("batched" in r.name or "--vad" in r.command for r in plain)
    extra = [r for r in both if r.name not in {p.name for p in plain}]
    ours = [r for r in extra if r.name.startswith("specasr")]
    fw = [r for r in extra if r.name.startswith("faster-whisper")]
    assert len(ours) == 2 and len(fw) == 2
    for r in ours:  # exact, fp32 and int8, on the text-only batched path
        assert r.command[-len(BATCHED) :] == BATCHED and "exact" in r.command
    assert [r for r in ours if "int8" in r.command]
    assert all(FW_SCRIPT in r.command and r.command[-2:] == ["x.wav", "8"] for r in fw)  # batches of 8
    assert {r.command[-4] for r in fw} == {"float32", "int8"}


def test_int8_bfloat16_rows_come_only_where_bf16_is_native():
    plain = rows_for("x.wav", None, 2, batched=True)
    with_bf16 = rows_for("x.wav", None, 2, batched=True, bf16=True)
    assert not any("int8_bfloat16" in r.command for r in plain)
    extra = [r for r in with_bf16 if r.name not in {p.name for p in plain}]
    assert len(extra) == 2 and all(
        r.command[r.command.index("--compute-type") + 1] == "int8_bfloat16" for r in extra
    )
    assert sum(r.command[-len(BATCHED) :] == BATCHED for r in extra) == 1  # one per path


@pytest.mark.slow  # tiny.en through the CLI
def test_the_cli_takes_the_batched_flags(tmp_path):
    args = ["transcribe", EXAMPLE, "--model", "tiny.en", "--mode", "autoregressive", "-o", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, *BATCHED])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "example.txt").read_text().strip()


@pytest.mark.slow  # base's CTranslate2 files through faster-whisper
@pytest.mark.skipif(find_spec("faster_whisper") is None, reason="faster-whisper is optional (specasr[bench])")
def test_faster_whispers_batched_script_transcribes_the_example(tmp_path):
    cmd = [sys.executable, "-c", FW_SCRIPT, str(ct2_dir(tmp_path)), "int8", "2", EXAMPLE, "8"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert len(out.stdout.split()) > 5 and "PHASES" in out.stderr


def test_only_keeps_the_rows_named():
    rows = rows_for("x.wav", Path("ct2"), 2, batched=True)
    kept = chosen(rows, "exact --compute-type int8, faster-whisper int8")
    assert kept and all(
        "exact --compute-type int8" in r.name or "faster-whisper int8" in r.name for r in kept
    )
    assert chosen(rows, None) == rows and chosen(rows, "nothing like it") == []


# counts the processes whose command line ends in `-c BUSY` (not this script: BUSY is its argument)
COUNT_BUSY = """
import glob
from benchmarks.whole_process import BUSY
n = 0
for p in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        n += open(p, "rb").read().endswith(b"-c\\0" + BUSY.encode() + b"\\0")
    except OSError:
        pass
print(n)
"""


def test_busy_processes_run_beside_the_command_and_are_gone_after():
    before = int(subprocess.run([sys.executable, "-c", COUNT_BUSY], capture_output=True, text=True).stdout)
    seen = int(beside_busy(2, [sys.executable, "-c", COUNT_BUSY])[2])
    after = int(subprocess.run([sys.executable, "-c", COUNT_BUSY], capture_output=True, text=True).stdout)
    assert seen == before + 2 and after == before


def test_the_busy_table_gives_each_level_beside_the_quiet_median():
    walls = {"fw": {0: [2.0, 2.2, 1.8], 1: [3.0, 3.0, 3.3], 2: [4.0, 4.1, 3.9]}}
    lines = busy_table(walls).splitlines()
    assert lines[0] == "| command | quiet: s | 1 busy: s | slowdown | 2 busy: s | slowdown |"
    assert lines[2] == "| fw | 2.00 | 3.00 | 1.50× | 4.00 | 2.00× |"
    assert Row("x", []).walls == []


def test_busy_rounds_add_each_specasr_row_with_openmp_spinning():
    rows = rows_for("x.wav", Path("ct2"), 2)
    spin = spinning(rows)
    ours = [r for r in rows if r.name.startswith("specasr")]
    assert [s.name for s in spin] == [f"{r.name} (spinning)" for r in ours]
    assert all(s.command == ["env", "SPECASR_PASSIVE_WHEN_BUSY=0", *r.command] for s, r in zip(spin, ours))


def test_without_adds_each_specasr_row_with_the_trick_off():
    rows = rows_for("x.wav", Path("ct2"), 2)
    off = without(rows, "defer_torch_parts")
    ours = [r for r in rows if r.name.startswith("specasr")]
    assert [o.name for o in off] == [f"{r.name} (defer_torch_parts off)" for r in ours]
    assert all(o.command == ["env", "SPECASR_DEFER_TORCH_PARTS=0", *r.command] for o, r in zip(off, ours))


def test_without_names_only_known_tricks():
    from benchmarks.whole_process import main as bench

    result = CliRunner().invoke(bench, ["--without", "no_such_trick"])
    assert result.exit_code == 2 and "no_such_trick" in result.output


def test_loops_play_the_recording_again_a_second_apart():
    import numpy as np

    from benchmarks.whole_process import looped

    x = np.arange(1, 6, dtype=np.float32)
    assert looped(x, 1) is not x and np.array_equal(looped(x, 1), x)
    twice = looped(x, 3)
    assert twice.shape == (3 * 5 + 2 * 16000,) and twice.dtype == np.float32
    assert np.array_equal(twice[:5], x) and np.array_equal(twice[-5:], x)
    assert np.array_equal(twice[5 + 16000 : 10 + 16000], x) and not twice[5 : 5 + 16000].any()


def test_busy_rows_add_the_tricks_off_and_spinning_for_specasr_rows_only():
    rows = [Row("specasr transcribe --mode exact", ["x"]), Row("faster-whisper int8", ["y"])]
    names = [r.name for r in busy_rows(rows, ["one_thread_decoding"])]
    assert names == [
        "specasr transcribe --mode exact",
        "faster-whisper int8",
        "specasr transcribe --mode exact (one_thread_decoding off)",
        "specasr transcribe --mode exact (spinning)",
    ]
