"""The two sampling rules side by side (`DecodeOptions.sampling`): coupled (decode/race.py: a
draft token is accepted when it is the target's race winner at its position) against
rejection (Leviathan et al., the paper's kernels), at the fallback temperatures.

    python -m benchmarks.coupled --files 8 --repeats 3

On held-out windows (one per file, the language given), each temperature decodes every window
exactly (the packaged draft) under both rules and autoregressively, alternating rules within a
repeat, seeds varied per repeat. Prints per rule and temperature: α̂ (draft tokens accepted per
proposed), tokens per target call, the decoder time's median, and, for the coupled rule, whether
every window's tokens equal the autoregressive ones for the same seed.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import click

from benchmarks.serve_load import commit, input_paths, machine

TEMPERATURES = (0.2, 0.4, 0.6, 0.8, 1.0)


def decode_all(pair, mels, options) -> tuple[float, list[list[int]], object]:
    """-> (decoder wall s, tokens per window, merged stats): each window alone."""
    from specasr.decode.loop import decode
    from specasr.stats import DecodeStats

    stats, tokens = DecodeStats(), []
    start = time.perf_counter()
    for mel in mels:
        results = decode(pair, mel, options)
        tokens.append(results[0].tokens)
        stats = stats.merge(results[0].stats)
    return time.perf_counter() - start, tokens, stats


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--files", type=click.IntRange(1), default=8, show_default=True)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--corpus", default="/tmp/corpus/heldout", show_default=True, help="A corpus split.")
@click.option("--source", default="asterisk:en", show_default=True)
def main(model: str, draft: str, files: int, repeats: int, corpus: str, source: str) -> None:
    from specasr.audio import load_audio
    from specasr.cli.common import pair_loader
    from specasr.features import log_mel_window
    from specasr.options import DecodeOptions

    paths = input_paths((), corpus, source, files)
    pair = pair_loader(model, draft, "exact", None, None)()
    mels = [log_mel_window(load_audio(p), pair.n_mels) for p in paths]  # each [1, n_mels, 3000]
    print(f"# {machine()}; commit {commit()}; {len(mels)} held-out windows, {model} + {draft}")
    print("| T | rule | α̂ (accepted/proposed) | tokens per target call | decoder s (median) | = AR |")
    print("|---|---|---|---|---|---|")
    for t in TEMPERATURES:
        runs: dict[str, list] = {"coupled": [], "rejection": [], "autoregressive": []}
        same = True
        for r in range(repeats):
            base = DecodeOptions(
                temperature=t, seed=100 * r, language="en", timestamps=True, max_new_tokens=224
            )
            ar = decode_all(pair, mels, replace(base, mode="autoregressive"))
            runs["autoregressive"].append(ar)
            for rule in ("coupled", "rejection") if r % 2 == 0 else ("rejection", "coupled"):
                run = decode_all(pair, mels, replace(base, sampling=rule))
                runs[rule].append(run)
                if rule == "coupled":
                    same &= run[1] == ar[1]
        for rule, rows in runs.items():
            stats = rows[0][2]
            for row in rows[1:]:
                stats = stats.merge(row[2])
            wall = statistics.median(row[0] for row in rows)
            alpha = f"{stats.acceptance_rate:.3f}" if stats.proposed else "—"
            per_call = stats.tokens_per_target_call if stats.target_calls else 0.0
            equal = ("yes" if same else "NO") if rule == "coupled" else ""
            print(f"| {t:.1f} | {rule} | {alpha} | {per_call:.2f} | {wall:.2f} | {equal} |")


if __name__ == "__main__":
    main()
