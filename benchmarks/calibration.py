"""Backoff under this machine's measured cost curves against the built-in tables.

    python -m benchmarks.calibration --files 16 --repeats 3 [--batch 8] [--compute-type int8]
        [--audio "dir/*.wav"]

First it calibrates (`specasr.decode.calibration.calibrate`: the curves at 1 row, and at 2, 4
and 8 rows with --batch, stored in the cache as `specasr calibrate` stores them) and prints how
long that took and the curves beside the built-in tables. Then, on held-out windows (the
language given, timestamps on, as long-form decodes them), it decodes every window alone
(--batch 1) or the windows in batches of --batch rows, in exact mode with the auto γ policy
(backoff on a CPU) under the built-in tables (SPECASR_CALIBRATE=off) and under the measured
curves (cached), and target-only for reference, alternating within each repeat. Prints per
configuration the decoder time's median over repeats, its ratio to target-only, target passes,
draft steps, and whether every window's tokens equal target-only's.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace

import click

from benchmarks.serve_load import commit, input_paths, machine
from specasr.cli.common import compute_type_option


def decode_batches(pair, mels, options, batch: int):
    """-> (decoder wall s, tokens per window, merged stats): the windows `batch` at a time."""
    import torch

    from specasr.decode.loop import decode
    from specasr.stats import DecodeStats

    stats, tokens = DecodeStats(), []
    start = time.perf_counter()
    for i in range(0, len(mels), batch):
        results = decode(pair, torch.cat(mels[i : i + batch]), options)  # [b, n_mels, 3000] in
        tokens += [r.tokens for r in results]
        stats = stats.merge(results[0].stats)  # one stats object per decode call, shared by its rows
    return time.perf_counter() - start, tokens, stats


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@compute_type_option("The target's.")
@click.option("--files", type=click.IntRange(1), default=16, show_default=True)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--batch", type=click.IntRange(1, 64), default=1, show_default=True, help="Rows per decode.")
@click.option("--corpus", default="/tmp/corpus/heldout", show_default=True, help="A corpus split.")
@click.option("--source", default="asterisk:en", show_default=True)
@click.option("--audio", multiple=True, help="Globs of audio files, instead of the corpus; repeatable.")
def main(model, draft, compute_type, files, repeats, batch, corpus, source, audio) -> None:
    import torch

    from specasr.audio import load_audio
    from specasr.cli.common import pair_loader
    from specasr.decode import calibration
    from specasr.features import log_mel_window
    from specasr.options import DecodeOptions

    paths = input_paths(audio, corpus, source, files)[:files]
    pair = pair_loader(model, draft, "exact", None, None, compute_type)()
    mels = [log_mel_window(load_audio(p), pair.n_mels) for p in paths]  # each [1, n_mels, 3000]
    rows = calibration.needed(batch)
    t0 = time.perf_counter()
    measured, path = calibration.calibrate(pair, rows)
    took = time.perf_counter() - t0
    print(f"# {machine()}; {torch.get_num_threads()} threads; commit {commit()}")
    print(f"# {model} [{pair.compute_type}] + {pair.draft_name}; {len(mels)} windows, {batch} per decode")
    print(f"\ncalibration at {', '.join(map(str, rows))} rows: {took:.2f} s, stored in {path}\n")
    ks = list(range(1, calibration.MAX_K + 1))
    stored = calibration.stored_tables(pair)
    print(calibration.cost_table({b: measured[b] for b in rows}, stored, ks))
    print(
        "\nbreak-even α: "
        + ", ".join(
            f"{b} rows {measured[b].break_even():.2f} (table {stored[b].break_even():.2f})" for b in rows
        )
    )

    base = DecodeOptions(language="en", timestamps=True, gamma_policy="auto")
    configs = {  # name -> (options, SPECASR_CALIBRATE)
        "target only": (replace(base, mode="autoregressive"), "off"),
        "exact, backoff on the built-in tables": (replace(base, mode="exact"), "off"),
        "exact, backoff on the measured curves": (replace(base, mode="exact"), "cached"),
    }
    times = {name: [] for name in configs}
    tokens, stats = {}, {}
    before = os.environ.get("SPECASR_CALIBRATE")
    try:
        decode_batches(pair, mels[:batch], configs["target only"][0], batch)  # warm-up
        for _ in range(repeats):
            for name, (opts, how) in configs.items():
                os.environ["SPECASR_CALIBRATE"] = how
                seconds, tokens[name], stats[name] = decode_batches(pair, mels, opts, batch)
                times[name].append(seconds)
    finally:
        if before is None:
            os.environ.pop("SPECASR_CALIBRATE", None)
        else:
            os.environ["SPECASR_CALIBRATE"] = before
    ref = statistics.median(times["target only"])
    print(f"\n{repeats} repeats, medians\n")
    print("| configuration | decoder s | × target-only time | target passes | draft steps | = target-only |")
    print("|---|---|---|---|---|---|")
    for name in configs:
        s = statistics.median(times[name])
        same = "yes" if tokens[name] == tokens["target only"] else "no"
        st = stats[name]
        print(f"| {name} | {s:.2f} | {s / ref:.2f} | {st.target_calls} | {st.draft_calls} | {same} |")


if __name__ == "__main__":
    main()
