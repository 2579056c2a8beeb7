"""Windows decoded one by one against as one ragged batch: what a shared decode batch of
`specasr serve` (`SharedEngine`) costs its requests.

    python -m benchmarks.shared_batch --rows 16 --repeats 3

The first `rows` held-out files (one window each) are encoded once. Each repeat, alternating,
decodes them one by one and as one batch of `rows` rows, exact and target-only, the language
given; every decode reads a fresh copy of its encoder states, so each projects its cross K/V
as a request's first decode does. Prints the medians of the decoder time and of its window
set-up (the projections), the batch's share of the one-by-one time, and whether every row's
tokens equal its one-by-one tokens.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import click

from benchmarks.serve_load import commit, input_paths, machine


def decode_rows(pair, states, options, batched: bool) -> tuple[float, float, float, list[list[int]]]:
    """-> (wall s, decoder s, window set-up s, tokens per row): the rows in one batch, or one by one."""
    import torch

    from specasr.decode.loop import decode_states
    from specasr.stats import DecodeStats

    groups = [torch.cat(states)] if batched else states
    stats, tokens = DecodeStats(), []
    start = time.perf_counter()
    for group in groups:
        fresh = group.clone()  # projected anew, as a request's first decode
        one = DecodeStats()
        draft = fresh if options.speculative else None
        tokens += [r.tokens for r in decode_states(pair, fresh, draft, options, None, one)]
        stats = stats.merge(one)
    return time.perf_counter() - start, stats.decoder_s, stats.window_s, tokens


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--rows", type=click.IntRange(2), default=16, show_default=True, help="Files, one row each.")
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--corpus", default="/tmp/corpus/heldout", show_default=True, help="A corpus split.")
@click.option("--source", default="asterisk:en", show_default=True)
@click.option("--language", default="en", show_default=True)
@click.option("--compute-type", default="float32", show_default=True, help="The server's --compute-type.")
def main(
    model: str,
    draft: str,
    rows: int,
    repeats: int,
    corpus: str,
    source: str,
    language: str,
    compute_type: str,
) -> None:
    import torch

    from specasr.audio import load_audio
    from specasr.cli.common import pair_loader
    from specasr.features import log_mel_window
    from specasr.options import front_end_options

    paths = input_paths((), corpus, source, rows)
    if len(paths) < rows:
        raise click.BadParameter(f"{len(paths)} files of {source!r}, fewer than --rows {rows}")
    pair = pair_loader(model, draft, "exact", None, None, compute_type, True)()
    if not pair.shared_encoder:
        raise click.UsageError(f"draft {draft!r} has an encoder of its own; this measures one-encoder pairs")
    with torch.inference_mode():  # [1, 1500, d] per file: the target's and the draft's (one encoder)
        mels = [log_mel_window(load_audio(p), pair.n_mels).reshape(1, pair.n_mels, -1) for p in paths]
        states = [pair.encode(mel)[0] for mel in mels]
    base = replace(front_end_options(language=language).decode, timing=True)
    named = f"{rows} files of {source}, {model} + {draft}, {pair.compute_type}"
    print(f"machine: {machine()} · commit: {commit()} · {named}")
    heads = ("mode", "one by one: decoder s (set-up s)", "one batch: decoder s (set-up s)", "batch / alone")
    print("\n| " + " | ".join(heads) + " | tokens equal |")
    print("|---|---|---|---|---|")
    for mode in ("exact", "autoregressive"):
        options = replace(base, mode=mode)
        runs = {False: [], True: []}
        same = True
        decode_rows(pair, states[:2], options, True)  # warm-up
        for _ in range(repeats):
            for batched in (False, True):
                runs[batched].append(decode_rows(pair, states, options, batched))
            same &= runs[False][-1][3] == runs[True][-1][3]
        alone, batch = ([statistics.median(r[i] for r in runs[b]) for i in (1, 2)] for b in (False, True))
        print(
            f"| {mode} | {alone[0]:.2f} ({alone[1]:.2f}) | {batch[0]:.2f} ({batch[1]:.2f}) "
            f"| {batch[0] / alone[0]:.2f} | {'yes' if same else 'NO'} |"
        )


if __name__ == "__main__":
    main()
