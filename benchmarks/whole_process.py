"""Whole-process speed and memory: `specasr transcribe` against faster-whisper, side by side.

    python -m benchmarks.whole_process --repeats 5 [--long [--batched]] [--threads N]
        [--corpus CORPUS/heldout --source asterisk:en --per-source 16] [--loops N] [--busy 0,1,2]

Each command runs as a fresh process, as a user runs it (specasr's bytecode compiled first,
as an install from a wheel has it: `compile_bytecode`), in interleaved rounds so machine
noise hits every system alike; the table gives the median wall time and peak RSS per
command and the ratio to faster-whisper fp32 on the same clip. The systems share weights:
faster-whisper loads the packaged CTranslate2 files of the `base` preset (the parts joined
into one model.bin), specasr converts the same files once and caches them. Both decode
greedily with timestamps, Whisper's fallback schedule, language "en".

Rows:
- `import + load_pair("base")`: `python -c` that imports specasr and loads the pair;
- `specasr transcribe CLIP --mode exact|autoregressive [--compute-type int8]`: the CLI, models
  loaded every run;
- `faster-whisper fp32|int8`: a plain script (`cpu_threads` = this machine's cores);
- `--long`: the long-form fixture, or with `--corpus` windows of one source of a corpus split
  joined with silences (e.g. held-out speech no draft trained on; English sources, as both
  systems decode with language "en"); `--loops N` plays it N times, 1 s apart (the held-out
  split holds about 5 minutes: twice over is the 10-minute recording of the memory rows);
- with `--long --batched`, on that recording: each system's batched, text-only path
  (VAD, batches of 8 windows, no timestamps): specasr exact fp32 and int8, faster-whisper's
  `BatchedInferencePipeline` fp32 and int8;
- on a CPU with native bf16 (`specasr.backends.cpu.bf16.available`), specasr exact `--compute-type
  int8_bfloat16` too, on each path.

faster-whisper is optional (`pip install "specasr[bench]"`); without it those rows are skipped.
Run it on a quiet machine: a second busy process makes CTranslate2's threads spin.

`--busy 0,1,2`: a busy machine, as users' machines are. Each round runs every row beside 0, 1
and 2 busy processes (a pure-Python loop each, started before the row's process and stopped
after it), the levels interleaved within the round; the table gives each row's median wall per
level and its slowdown, that median ÷ the row's own median with no busy process; each specasr
row runs also with OpenMP's threads spinning whatever the load (`SPECASR_PASSIVE_WHEN_BUSY=0`).

`--without defer_torch_parts` (any trick of `specasr.backends.process`, comma-separated): each
specasr row also runs with that trick switched off, in the same interleaved rounds (with `--busy`
too, at every level).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from benchmarks.longform import corpus_options

# stdout: the transcript; stderr: a PHASES line of perf_counter marks (`benchmarks.startup`).
# A fifth argument, a batch size, runs faster-whisper's `BatchedInferencePipeline` instead:
# Silero VAD cuts, batches of windows, text tokens only (its default `without_timestamps`),
# its fastest long-form path.
FW_SCRIPT = """
import json, sys, time
T = {"start": time.perf_counter()}
from faster_whisper import BatchedInferencePipeline, WhisperModel
T["import"] = time.perf_counter()
model_dir, compute_type, threads, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
batch = int(sys.argv[5]) if len(sys.argv) > 5 else 0
model = WhisperModel(model_dir, device="cpu", compute_type=compute_type, cpu_threads=threads)
T["load"] = time.perf_counter()
if batch:
    segments, _ = BatchedInferencePipeline(model).transcribe(
        path, beam_size=1, best_of=1, language="en", batch_size=batch
    )
else:
    segments, _ = model.transcribe(path, beam_size=1, best_of=1, language="en", vad_filter=False)
print(" ".join(s.text.strip() for s in segments))
T["main end"] = time.perf_counter()
print("PHASES " + json.dumps({"marks": T}), file=sys.stderr)
"""

BATCH = 8  # windows per batch on both systems' batched paths
# specasr's like: VAD, chunked windows in batches, text tokens only
BATCHED = ["--vad", "--strategy", "chunked", "--batch-size", str(BATCH), "--without-timestamps"]

# os._exit: the interpreter's teardown (about 0.3 s) is not part of import + load
LOAD_SCRIPT = "import os, specasr; specasr.load_pair('base'); os._exit(0)"


@dataclass
class Row:
    name: str
    command: list[str]
    walls: list[float] = field(default_factory=list)  # seconds per run
    rss: list[float] = field(default_factory=list)  # peak RSS per run, MB
    outputs: list[str] = field(default_factory=list)


def run_measured(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MB, stdout) of one fresh process, via os.wait4."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}): {err.read().strip()[-500:]}")
        return wall, usage.ru_maxrss / 1024, out.read()


def ct2_dir(root: Path, preset: str = "base") -> Path:
    """A packaged preset's CTranslate2 files (model.bin parts joined) as one directory
    faster-whisper can load, under `root`."""
    from specasr.models.loading import offline_files

    files = offline_files(preset)
    out = root / f"ct2-{preset}"
    if not (out / "model.bin").is_file():
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "model.bin.tmp", "wb") as dst:
            for part in files.model_parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 22)
        os.replace(out / "model.bin.tmp", out / "model.bin")
        for extra in (files.config, files.tokenizer, files.config.parent / "vocabulary.json"):
            if extra.is_file():
                shutil.copy(extra, out / extra.name)
    return out


def looped(samples, loops: int):
    """samples [n] played `loops` times with 1 s of silence between: [loops·n + (loops - 1)·16000]."""
    import numpy as np

    from specasr.constants import SAMPLE_RATE

    gap = np.zeros(SAMPLE_RATE, dtype=samples.dtype)
    return np.concatenate([part for _ in range(loops) for part in (gap, samples)][1:])


def compile_bytecode() -> None:
    """Byte-compiles specasr's modules where their cached bytecode is missing, as `pip install
    .` does at install time: an editable install run under PYTHONDONTWRITEBYTECODE (as on the
    team's machines) never writes it, and would compile every module on every start (about
    0.06 s) where faster-whisper, installed from a wheel, starts from bytecode."""
    import compileall

    import specasr

    compileall.compile_dir(str(Path(specasr.__file__).parent), quiet=1)


def rows_for(
    clip: str, fw_dir: Path | None, threads: int, batched: bool = False, bf16: bool = False
) -> list[Row]:
    """The commands timed on one clip; batched: also each system's batched, text-only
    long-form path (VAD, batches of 8 windows, no timestamps), exact fp32 and int8 for specasr;
    bf16 (a CPU with native bf16): also specasr exact int8_bfloat16, on each path."""
    cli = [sys.executable, "-m", "specasr", "transcribe", clip, "--language", "en"]  # as fw is run
    rows = [
        Row("specasr transcribe --mode exact", [*cli, "--mode", "exact"]),
        Row("specasr transcribe --mode autoregressive", [*cli, "--mode", "autoregressive"]),
        Row(
            "specasr transcribe --mode autoregressive --compute-type int8",
            [*cli, "--mode", "autoregressive", "--compute-type", "int8"],
        ),
        Row(
            "specasr transcribe --mode exact --compute-type int8",
            [*cli, "--mode", "exact", "--compute-type", "int8"],
        ),
    ]
    both = ["--mode", "exact", "--compute-type", "int8_bfloat16"]
    if bf16:
        rows.append(Row(f"specasr transcribe {' '.join(both)}", [*cli, *both]))
    if batched:
        flags = " ".join(BATCHED)
        rows.append(Row(f"specasr transcribe --mode exact {flags}", [*cli, "--mode", "exact", *BATCHED]))
        rows.append(
            Row(
                f"specasr transcribe --mode exact --compute-type int8 {flags}",
                [*cli, "--mode", "exact", "--compute-type", "int8", *BATCHED],
            )
        )
        if bf16:
            rows.append(Row(f"specasr transcribe {' '.join(both)} {flags}", [*cli, *both, *BATCHED]))
    if fw_dir is not None:
        for ct in ("float32", "int8"):
            cmd = [sys.executable, "-c", FW_SCRIPT, str(fw_dir), ct, str(threads), clip]
            rows.append(Row(f"faster-whisper {ct}", cmd))
        for ct in ("float32", "int8") if batched else ():
            cmd = [sys.executable, "-c", FW_SCRIPT, str(fw_dir), ct, str(threads), clip, str(BATCH)]
            rows.append(Row(f"faster-whisper batched B={BATCH} + VAD, no timestamps, {ct}", cmd))
    return rows


def table(rows: list[Row], reference: str | None) -> str:
    ref = next((r for r in rows if r.name == reference), None)
    ref_wall = statistics.median(ref.walls) if ref else None
    lines = [
        "| command | wall (median, s) | lowest – highest | peak RSS (median, MB) | vs faster-whisper fp32 |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        wall = statistics.median(r.walls)
        ratio = f"{wall / ref_wall:.2f}×" if ref_wall else "—"
        lines.append(
            f"| {r.name} | {wall:.2f} | {min(r.walls):.2f} – {max(r.walls):.2f} "
            f"| {statistics.median(r.rss):.0f} | {ratio} |"
        )
    return "\n".join(lines)


BUSY = "while True: pass"  # one core's worth of work that never yields


def beside_busy(n: int, command: list[str]) -> tuple[float, float, str]:
    """`run_measured(command)` with `n` busy processes running beside it."""
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]
    try:
        time.sleep(0.3 if n else 0.0)  # past their interpreters' start: each is spinning
        return run_measured(command)
    finally:
        for p in busy:
            p.kill()
            p.wait()


def measure_busy(rows: list[Row], repeats: int, levels: list[int]) -> dict[str, dict[int, list[float]]]:
    """Interleaved rounds as `measure`, each row at every busy level in turn: row name -> level ->
    wall seconds per round (after one quiet warm-up round)."""
    for r in rows:
        run_measured(r.command)
    walls = {r.name: {n: [] for n in levels} for r in rows}
    for _ in range(repeats):
        for r in rows:
            for n in levels:
                wall, rss, out = beside_busy(n, r.command)
                walls[r.name][n].append(wall)
                r.outputs.append(out.strip())
    return walls


def chosen(rows: list[Row], only: str | None) -> list[Row]:
    """The rows whose name contains one of the comma-separated parts of `only` (all: None)."""
    if only is None:
        return rows
    parts = [p.strip() for p in only.split(",") if p.strip()]
    return [r for r in rows if any(p in r.name for p in parts)]


def without(rows: list[Row], trick: str, label: str | None = None) -> list[Row]:
    """The specasr rows again with `trick` (a name in `specasr.backends.process.TRICKS`)
    switched off, named with `label` (default: "<trick> off")."""
    from specasr.backends.process import TRICKS

    off = ["env", f"{TRICKS[trick].env}=0"]
    label = label or f"{trick} off"
    return [Row(f"{r.name} ({label})", [*off, *r.command]) for r in rows if r.name.startswith("specasr")]


def spinning(rows: list[Row]) -> list[Row]:
    """The specasr rows again with the trick `passive_when_busy` off: OpenMP's threads spin
    however busy the machine is, as before the trick (`specasr.backends.process`)."""
    return without(rows, "passive_when_busy", "spinning")


def busy_rows(rows: list[Row], off: list[str]) -> list[Row]:
    """A busy machine's rows: `rows`, their specasr ones again with each trick of `off` switched
    off, and with OpenMP's threads spinning (`spinning`)."""
    return [*rows, *(r for trick in off for r in without(rows, trick)), *spinning(rows)]


def busy_table(walls: dict[str, dict[int, list[float]]]) -> str:
    """Per row: the median wall at each busy level and its slowdown against the quiet level."""
    levels = sorted(next(iter(walls.values())))
    head = " | ".join(f"{n} busy: s | slowdown" if n else "quiet: s" for n in levels)
    lines = [f"| command | {head} |", "|---" * (1 + sum(2 if n else 1 for n in levels)) + "|"]
    for name, by_level in walls.items():
        quiet = statistics.median(by_level[levels[0]])
        cells = []
        for n in levels:
            m = statistics.median(by_level[n])
            cells.append(f"{m:.2f} | {m / quiet:.2f}×" if n else f"{m:.2f}")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def measure(rows: list[Row], repeats: int) -> None:
    """Interleaved rounds: every row once per round, `repeats` rounds, after one warm-up round
    (which fills the conversion cache and the page cache)."""
    for r in rows:
        run_measured(r.command)
    for _ in range(repeats):
        for r in rows:
            wall, rss, out = run_measured(r.command)
            r.walls.append(wall)
            r.rss.append(rss)
            r.outputs.append(out.strip())


@click.command()
@click.option("--repeats", type=int, default=5, show_default=True)
@click.option("--long/--no-long", "long_", default=False, help="Also the ~75 s long-form fixture.")
@click.option(
    "--threads", type=int, default=os.cpu_count() or 1, show_default=True, help="faster-whisper cpu_threads."
)
@click.option(
    "--data", type=click.Path(exists=True, file_okay=False), default="tests/data", show_default=True
)
@click.option(
    "--batched",
    is_flag=True,
    help="Long-form fixture: also each system's batched text-only path (VAD, batches of 8, no timestamps).",
)
@click.option(
    "--busy",
    default=None,
    help="Busy levels, e.g. 0,1,2: each row beside that many busy processes (0 first: the quiet "
    "reference); only the long recording with --long.",
)
@click.option(
    "--only",
    default=None,
    help="Comma-separated parts of row names: time only the rows whose name contains one of them.",
)
@click.option(
    "--loops",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="--long: the recording played this many times, 1 s apart (a longer recording from a short split).",
)
@corpus_options
@click.option(
    "--without",
    "tricks_off",
    default="",
    help="Comma-separated tricks (specasr.backends.process): each specasr row also with it off.",
)
def main(
    repeats: int,
    long_: bool,
    threads: int,
    data: str,
    batched: bool,
    busy: str | None,
    only: str | None,
    loops: int,
    corpus: str | None,
    source: str,
    per_source: int,
    tricks_off: str,
) -> None:
    from importlib.resources import files
    from importlib.util import find_spec

    from specasr.backends.cpu import bf16
    from specasr.backends.process import TRICKS

    off = [t.strip() for t in tricks_off.split(",") if t.strip()]
    if unknown := [t for t in off if t not in TRICKS]:
        raise click.BadParameter(f"{unknown}: not among {sorted(TRICKS)}", param_hint="--without")
    levels = None
    if busy is not None:
        try:
            levels = sorted({int(n) for n in busy.split(",") if n.strip()})
        except ValueError as e:
            raise click.BadParameter(f"{busy!r}: expected levels such as 0,1,2", param_hint="--busy") from e
        if not levels or levels[0] != 0:
            raise click.BadParameter("the levels must include 0, the quiet reference", param_hint="--busy")
    compile_bytecode()
    work = Path(tempfile.mkdtemp(prefix="specasr-whole-"))
    try:
        fw_dir = ct2_dir(work) if find_spec("faster_whisper") else None
        if fw_dir is None:
            click.echo("faster-whisper is not installed (pip install 'specasr[bench]'): its rows are skipped")
        # (title, path, with the batched rows): batching is a long-form path
        clips = [("bundled example (7.1 s)", str(files("specasr") / "assets" / "example.wav"), False)]
        if long_:
            import soundfile as sf

            from benchmarks.longform import recording
            from specasr.constants import SAMPLE_RATE

            rec, language = recording(data, corpus, source, per_source)
            samples = looped(rec.samples, loops)
            path = work / "long.wav"
            sf.write(path, samples, SAMPLE_RATE)
            what = "long-form fixture" if corpus is None else f"{source}, {per_source} windows of {corpus}"
            what += f", played {loops} times" if loops > 1 else ""
            if language not in (None, "en"):
                raise click.BadParameter(f"{source} is {language}: both systems decode English here")
            clips.append((f"{what} ({len(samples) / SAMPLE_RATE:.1f} s)", str(path), batched))
        if levels is not None:  # the busy machine: one recording, every row at every level
            title, clip, with_batched = clips[-1]
            rows = chosen(rows_for(clip, fw_dir, threads, with_batched, bf16=bf16.available()), only)
            if not rows:
                raise click.BadParameter(f"{only!r} names none of the rows", param_hint="--only")
            rows = busy_rows(rows, off)
            walls = measure_busy(rows, repeats, levels)
            click.echo(f"{repeats} rounds, interleaved, fresh processes; {os.cpu_count()} cores\n")
            click.echo(f"### {title}, beside busy processes\n\n{busy_table(walls)}\n")
            return
        load = Row('import + load_pair("base")', [sys.executable, "-c", LOAD_SCRIPT])
        measure([load], repeats)
        click.echo(f"{repeats} runs each, interleaved, fresh processes; {os.cpu_count()} cores\n")
        click.echo(table([load], None) + "\n")
        for title, clip, with_batched in clips:
            rows = chosen(rows_for(clip, fw_dir, threads, with_batched, bf16=bf16.available()), only)
            rows += [r for t in off for r in without(rows, t)]
            measure(rows, repeats)
            click.echo(f"### {title}\n")
            click.echo(table(rows, "faster-whisper float32" if fw_dir else None) + "\n")
            for r in rows:
                click.echo(f"- {r.name}: {r.outputs[-1][:160]}")
            click.echo("")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
