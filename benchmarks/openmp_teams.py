"""Transcribing in the main thread against in another thread, with the `one_openmp_team` trick
on and off: what a second OpenMP team costs a process that transcribes off its main thread
(an app's worker threads, a server's engine thread).

    python -m benchmarks.openmp_teams [--compute-type int8 --repeats 3]

For each setting of the trick (`SPECASR_ONE_OPENMP_TEAM`), a fresh process loads the pair and,
alternately per repeat, transcribes the held-out files in its main thread and in one
long-lived worker thread (as an app's), the language given, after one untimed round of each.
Prints the medians of the wall, encoder and decoder seconds per round, each against the main
thread's with the trick on, and whether every text is the same wherever it ran.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import click

from benchmarks.serve_load import commit, input_paths, machine

SWITCH = "SPECASR_ONE_OPENMP_TEAM"
PLACES = ("main", "worker")  # where a round of transcriptions runs


def transcribe_round(pair, paths: list[str], options) -> dict:
    """The files one by one -> wall, encoder and decoder seconds, texts."""
    import specasr

    wall = encoder = decoder = 0.0
    texts = []
    for path in paths:
        start = time.perf_counter()
        segments, info = specasr.transcribe(path, pair, options)
        texts.append("".join(s.text for s in segments).strip())
        wall += time.perf_counter() - start
        encoder += info.stats.encoder_s
        decoder += info.stats.decoder_s
    return {"wall": wall, "encoder": encoder, "decoder": decoder, "texts": texts}


def measure(paths: list[str], model: str, draft: str, compute_type: str, repeats: int) -> dict:
    """In this process: per place, the rounds' medians and the texts of the last round."""
    from specasr.cli.common import pair_loader
    from specasr.options import front_end_options

    pair = pair_loader(model, draft, "exact", None, None, compute_type)()
    options = front_end_options(mode="exact", language="en")
    rounds: dict[str, list[dict]] = {place: [] for place in PLACES}
    with ThreadPoolExecutor(1) as worker:  # one thread for every worker round, as an app's
        run = {
            "main": lambda: transcribe_round(pair, paths, options),
            "worker": lambda: worker.submit(transcribe_round, pair, paths, options).result(),
        }
        for place in PLACES:  # untimed
            run[place]()
        for _ in range(repeats):
            for place in PLACES:
                rounds[place].append(run[place]())
    return {
        place: {k: statistics.median(r[k] for r in rs) for k in ("wall", "encoder", "decoder")}
        | {"texts": rs[-1]["texts"]}
        for place, rs in rounds.items()
    }


def table(results: dict[str, dict]) -> str:
    """One row per (trick, place); times against the main thread with the trick on."""
    ref = results["on"]["main"]
    lines = [
        "| one_openmp_team | thread | wall s | encoder s | decoder s | decoder / main, on |",
        "|---|---|---|---|---|---|",
    ]
    for trick, places in results.items():
        for place in PLACES:
            r = places[place]
            lines.append(
                f"| {trick} | {place} | {r['wall']:.2f} | {r['encoder']:.2f} | {r['decoder']:.2f} "
                f"| {r['decoder'] / ref['decoder']:.2f}× |"
            )
    return "\n".join(lines)


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--compute-type", default="int8", show_default=True)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--corpus", default="/tmp/corpus/heldout", show_default=True, help="A corpus split.")
@click.option("--source", default="asterisk:en", show_default=True)
@click.option("--per-source", type=click.IntRange(1), default=16, show_default=True)
@click.option("--child", is_flag=True, hidden=True, help="Measure here; print one JSON line.")
def main(
    model: str,
    draft: str,
    compute_type: str,
    repeats: int,
    corpus: str,
    source: str,
    per_source: int,
    child: bool,
) -> None:
    paths = input_paths((), corpus, source, per_source)
    if not paths:
        raise click.BadParameter(f"no files of {source!r} in {corpus}", param_hint="'--corpus'")
    if child:
        print(json.dumps(measure(paths, model, draft, compute_type, repeats)))
        return
    args = sys.argv[1:] + ["--child"]
    results = {}
    for trick in ("on", "off"):
        env = {**os.environ, SWITCH: "1" if trick == "on" else "0"}
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.openmp_teams", *args],
            env=env, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        results[trick] = json.loads(out.strip().splitlines()[-1])
    texts = [places[p]["texts"] for places in results.values() for p in PLACES]
    named = f"{len(paths)} files of {source}, {model} + {draft}, {compute_type}, median of {repeats}"
    print(f"machine: {machine()} · commit: {commit()} · {named}\n")
    print(table(results))
    print(f"\nsame texts everywhere: {'yes' if all(t == texts[0] for t in texts) else 'NO'}")


if __name__ == "__main__":
    main()
