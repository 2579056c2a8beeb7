"""Where a fresh `specasr transcribe` process spends its time, phase by phase (issue 17).

    python -m benchmarks.startup --repeats 5 [--mode exact] [--faster-whisper] [-- CLI options]

`benchmarks.whole_process` gives the wall time of the whole command against faster-whisper;
this splits the same command into its phases (and, with `--faster-whisper`, a plain
faster-whisper script on the same weights into its import, load, transcription and exit).
Each run is a fresh process (the clip: the bundled example unless `--clip`) that marks, with
perf_counter:
- python: the interpreter's start (site included), taken as a bare `python -c pass` process's
  wall, at most what the parent saw outside the child's own clock;
- import torch (with Python's collector paused, as under `specasr.cli.common.start_up`, which
  the run then enters itself); import specasr (the CLI and the
  modules it imports before loading);
- load: target (`load_pair` less the draft) and draft (`load_draft` + `quantize_int8`);
- encode (`ModelPair.encode`: log-Mel is outside it) and the rest of the run (audio, log-Mel,
  language detection, decoding, writing);
- exit: the rest of what the parent saw outside the child's clock, from the end of `main` to
  the end of the process (atexit handlers; `cli.run` skips the interpreter's teardown).
The table gives the median of each phase over the runs, after one warm-up run.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import click

from benchmarks.whole_process import FW_SCRIPT, run_measured

CHILD = """
import sys, time
T = {"start": time.perf_counter()}
import gc
gc.disable()  # the CLI imports torch inside `load_models`' start-up, with the collector paused
from specasr.backends import process
process.defer_torch_parts()  # as the CLI's group does before any subcommand imports torch
import torch
T["import torch"] = time.perf_counter()
import specasr.cli
import specasr.models.draft as D
import specasr.models.loading as L
T["import specasr"] = time.perf_counter()
gc.enable()  # resumed before the run: its start-up pauses it again and freezes on leaving
spent = {"draft": 0.0, "encode": 0.0, "load": 0.0}

def timed(key, f):
    def g(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[key] += time.perf_counter() - t0
    return g

L.load_pair = timed("load", L.load_pair)
L.load_draft = timed("draft", L.load_draft)
D.DistilledDraft.quantize_int8 = timed("draft", D.DistilledDraft.quantize_int8)
L.ModelPair.encode = timed("encode", L.ModelPair.encode)

def report():
    T["main end"] = time.perf_counter()
    print("PHASES " + __import__("json").dumps({"marks": T, "spent": spent}), file=sys.stderr)

import atexit
atexit.register(report)
sys.argv = ["specasr", "transcribe", *sys.argv[1:]]
specasr.cli.run()
"""

PHASES = (
    "python",
    "import torch",
    "import specasr",
    "load target",
    "load draft",
    "encode",
    "rest of run",
    "exit",
)


def _outside(wall: float, bare: float, inside: float) -> tuple[float, float]:
    """(interpreter start, exit): what the parent saw outside the child's own clock (`inside`,
    its first line to the end of its work), the start taken as a bare interpreter's wall
    (`bare`, at most all of it) and the exit as the rest."""
    start = min(bare, wall - inside)
    return start, wall - inside - start


def phases(wall: float, bare: float, marks: dict, spent: dict) -> dict[str, float]:
    """One run's phases in seconds. wall: the parent's, of the whole process; bare: a
    `python -c pass` process's wall, taken as the interpreter's start."""
    t = marks
    start, exit_ = _outside(wall, bare, t["main end"] - t["start"])
    run = t["main end"] - t["import specasr"]
    return {
        "python": start,
        "import torch": t["import torch"] - t["start"],
        "import specasr": t["import specasr"] - t["import torch"],
        "load target": spent["load"] - spent["draft"],
        "load draft": spent["draft"],
        "encode": spent["encode"],
        "rest of run": run - spent["load"] - spent["encode"],
        "exit": exit_,
    }


def fw_phases(wall: float, bare: float, marks: dict) -> dict[str, float]:
    """faster-whisper's phases from one run of `whole_process.FW_SCRIPT`: its import, model
    load, and transcription (encoder and decoder together), start and exit as above."""
    t = marks
    start, exit_ = _outside(wall, bare, t["main end"] - t["start"])
    return {
        "python": start,
        "import": t["import"] - t["start"],
        "load": t["load"] - t["import"],
        "transcribe": t["main end"] - t["load"],
        "exit": exit_,
    }


def _child(script: str, args: list[str]) -> tuple[float, dict]:
    """(wall seconds, the PHASES record) of one fresh `python -c script args` process."""
    import subprocess
    import tempfile

    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", script, *args], stdout=subprocess.DEVNULL, stderr=err)
        wall = time.perf_counter() - t0
        err.seek(0)
        text = err.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {text[-500:]}")
    return wall, json.loads(
        next(x for x in text.splitlines() if x.startswith("PHASES ")).removeprefix("PHASES ")
    )


def run_once(args: list[str], bare: float) -> tuple[float, dict[str, float]]:
    """(wall seconds, phases) of one fresh `specasr transcribe ARGS` process."""
    wall, data = _child(CHILD, args)
    return wall, phases(wall, bare, data["marks"], data["spent"])


def _medians(one, repeats: int) -> tuple[float, dict[str, float]]:
    one()  # warm-up: the conversion cache and the page cache
    runs = [one() for _ in range(repeats)]
    return statistics.median(w for w, _ in runs), {
        n: statistics.median(p[n] for _, p in runs) for n in runs[0][1]
    }


def bare_start() -> float:
    """The wall of `python -c pass`: the interpreter's start (and its own exit)."""
    return statistics.median(run_measured([sys.executable, "-c", "pass"])[0] for _ in range(5))


def measure(args: list[str], repeats: int) -> tuple[float, dict[str, float]]:
    """Median wall and median of each phase over `repeats` fresh processes, after a warm-up."""
    bare = bare_start()
    return _medians(lambda: run_once(args, bare), repeats)


def measure_fw(ct2: str, clip: str, threads: int, repeats: int) -> tuple[float, dict[str, float]]:
    """The same for a plain faster-whisper script (fp32, greedy, `en`) on CTranslate2 files."""
    bare = bare_start()

    def one():
        wall, data = _child(FW_SCRIPT, [ct2, "float32", str(threads), clip])
        return wall, fw_phases(wall, bare, data["marks"])

    return _medians(one, repeats)


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--repeats", type=int, default=5, show_default=True)
@click.option("--mode", default="exact", show_default=True)
@click.option(
    "--clip", type=click.Path(exists=True, dir_okay=False), default=None, help="Default: the bundled example."
)
@click.option(
    "--faster-whisper/--no-faster-whisper",
    "with_fw",
    default=False,
    help="Also faster-whisper fp32 on the same weights (the `bench` extra), for comparison.",
)
@click.argument("cli_args", nargs=-1, type=click.UNPROCESSED)
def main(repeats: int, mode: str, clip: str | None, with_fw: bool, cli_args: tuple[str, ...]) -> None:
    import os
    import shutil
    import tempfile
    from importlib.resources import files
    from pathlib import Path

    from benchmarks.whole_process import compile_bytecode, ct2_dir

    compile_bytecode()  # as installed from a wheel
    clip = clip or str(files("specasr") / "assets" / "example.wav")
    args = [clip, "--language", "en", "--mode", mode, *cli_args]  # as faster-whisper is run
    wall, medians = measure(args, repeats)
    click.echo(f"specasr transcribe {' '.join(args)}: {repeats} fresh processes, median wall {wall:.2f} s\n")
    click.echo("| phase | s (median) | share of the wall |\n|---|---|---|")
    for name, s in medians.items():
        click.echo(f"| {name} | {s:.3f} | {s / wall:.0%} |")
    if with_fw:
        work = Path(tempfile.mkdtemp(prefix="specasr-startup-"))
        try:
            fw_wall, fw = measure_fw(str(ct2_dir(work)), clip, os.cpu_count() or 1, repeats)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        click.echo(f"\nfaster-whisper fp32, same clip and weights: median wall {fw_wall:.2f} s\n")
        click.echo("| phase | s (median) | share of the wall |\n|---|---|---|")
        for name, s in fw.items():
            click.echo(f"| {name} | {s:.3f} | {s / fw_wall:.0%} |")


if __name__ == "__main__":
    main()
