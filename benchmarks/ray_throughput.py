"""What Ray costs and gives on one machine: eval throughput of a single process against
1 and 2 local Ray workers, every decoder on one thread.

    python -m benchmarks.ray_throughput --model base --modes autoregressive --copies 8

The set is the LibriVox clips in --data (transcripts.txt), each `--copies` times under its
own id, as a manifest (or any recipe with --dataset NAME --data-dir DIR). Each setup
decodes the whole set into a fresh output directory under --work:

- `single process`: `Evaluator` in this process, torch on one thread; "start" loads the
  pair, "run" is `Evaluator.run`;
- `Ray, N worker(s)`: `RayEvaluator` on a local Ray started with N CPUs, one thread per
  actor; "start" is `ray.init`, "run" is `RayEvaluator.run` (the actors start and load the
  pair, decode, and the records come back).

Reports the run's wall time, utterances and audio seconds per wall second, speedup against
the single process, and whether every hypothesis equals the single process's. A machine
with other load makes these numbers noisy: run it on a quiet one.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

import click

from specasr.cli.common import pair_loader
from specasr.eval.runner import EvalOptions, Evaluator, pair_meta, select
from specasr.options import MODES, DecodeOptions


def _manifest(data: Path, copies: int, work: Path) -> Path:
    rows = [
        line.split(maxsplit=1) for line in (data / "transcripts.txt").read_text().splitlines() if line.strip()
    ]
    path = work / "clips.jsonl"
    with open(path, "w") as f:
        for k in range(copies):
            for clip_id, text in rows:
                audio = str((data / f"{clip_id}.wav").resolve())
                f.write(json.dumps({"id": f"{k:03d}-{clip_id}", "audio": audio, "text": text}) + "\n")
    return path


def _row(name: str, wall: float, records: list[dict], start: float) -> dict:
    ok = [r for r in records if r["error"] is None]
    return {
        "setup": name,
        "start_s": start,
        "wall_s": wall,
        "utterances": len({r["id"] for r in ok}),
        "audio_s": sum(r["duration"] for r in ok) / max(1, len({r["mode"] for r in ok})),
        "hyps": {(r["id"], r["mode"]): r["hypothesis"] for r in ok},
    }


def _table(rows: list[dict]) -> str:
    """start: loading the pair (single process) or ray.init (Ray); run: the eval run, for
    Ray with the actors' start and model loads; speedups against the single process."""
    one = rows[0]
    lines = [
        "| setup | start (s) | run (s) | start + run (s) | utterances | utt / s (run) | audio s / s (run) "
        "| speedup (run) | speedup (start + run) | same text |",
        "|---" * 10 + "|",
    ]
    for r in rows:
        total = r["start_s"] + r["wall_s"]
        lines.append(
            f"| {r['setup']} | {r['start_s']:.1f} | {r['wall_s']:.1f} | {total:.1f} | {r['utterances']} "
            f"| {r['utterances'] / r['wall_s']:.3f} | {r['audio_s'] / r['wall_s']:.2f} "
            f"| {one['wall_s'] / r['wall_s']:.2f}× | {(one['start_s'] + one['wall_s']) / total:.2f}× "
            f"| {'yes' if r['hyps'] == one['hyps'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--modes", default="autoregressive", show_default=True, help="Comma-separated decoding modes.")
@click.option(
    "--data", type=click.Path(exists=True, file_okay=False), default="tests/data", show_default=True
)
@click.option("--copies", type=int, default=4, show_default=True, help="Each clip this many times.")
@click.option("--dataset", default=None, help="A recipe name instead of the clips (with --data-dir).")
@click.option("--data-dir", type=click.Path(exists=True), default=None)
@click.option("--limit", type=int, default=None, help="Only the first N utterances.")
@click.option("--workers", default="1,2", show_default=True, help="Ray worker counts to run.")
@click.option("--batch-size", type=int, default=1, show_default=True)
@click.option(
    "--work",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for the set and the outputs (default: a temporary one, removed after).",
)
def main(model, draft, modes, data, copies, dataset, data_dir, limit, workers, batch_size, work) -> None:
    import ray
    import torch
    from specasr.recipes import DATASETS

    from specasr.eval.ray_runner import RayEvaluator, RayOptions, session

    with tempfile.TemporaryDirectory(prefix="ray-throughput-") as tmp:
        work = Path(work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        modes = tuple(m.strip() for m in modes.split(","))
        assert all(m in MODES for m in modes), modes
        options = EvalOptions(modes=modes, decode=DecodeOptions(), batch_size=batch_size, limit=limit)
        source = _manifest(Path(data), copies, work) if dataset is None else Path(data_dir)
        utts = select(DATASETS[dataset or "manifest"].load(source), options)
        mode = "exact" if any(m != "autoregressive" for m in modes) else "autoregressive"
        load = pair_loader(model, draft, mode, "cpu", None)
        meta = {"dataset": dataset or "librivox-clips", "model": model}

        def fresh(name: str) -> Path:
            out = work / name
            shutil.rmtree(out, ignore_errors=True)
            return out

        torch.set_num_threads(1)
        t0 = time.perf_counter()
        pair = load()
        start = time.perf_counter() - t0
        t0 = time.perf_counter()
        records = Evaluator(pair, options, fresh("single"), meta | pair_meta(pair, modes)).run(utts)
        rows = [_row("single process", time.perf_counter() - t0, records, start)]
        del pair
        for n in (int(w) for w in workers.split(",")):
            t0 = time.perf_counter()
            ray.init(num_cpus=n, include_dashboard=False, logging_level=logging.WARNING)
            start = time.perf_counter() - t0
            ray_options = RayOptions(workers=n, cpus_per_worker=1)
            with session(ray_options):  # joins the Ray just started; checks the CPUs
                t0 = time.perf_counter()
                records = RayEvaluator(load, options, fresh(f"ray-{n}"), meta, ray_options).run(utts)
                rows.append(_row(f"Ray, {n} worker(s)", time.perf_counter() - t0, records, start))
            ray.shutdown()
        n_audio = rows[0]["audio_s"]
        click.echo(
            f"{len(utts)} utterances ({n_audio:.0f} s of audio), model {model}, modes {','.join(modes)}, "
            f"batch {batch_size}, {torch.get_num_threads()} torch thread(s) per decoder\n"
        )
        click.echo(_table(rows))


if __name__ == "__main__":
    main()
