"""Beam search, target-only against speculative beams (decode/beam.py), beside greedy decoding.

    python -m benchmarks.beam --files 8 --repeats 3 --beams 5 --gammas 2,4,7

On held-out windows (one per file, the language given, timestamps on as long-form decodes
them), each repeat decodes every window alone in each configuration, alternating: greedy
target-only and exact, beam search target-only (what exact mode runs on a CPU by default), and
speculative beams (`speculative_beams=True`, the packaged draft) at each γ and under the
default γ policy (backoff on a CPU). Prints per configuration the decoder time's median over
repeats, its ratio to target-only beam search, target passes, and whether every window's
tokens equal target-only beam search's (greedy's are expected to differ somewhere).
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import click

from benchmarks.coupled import decode_all
from benchmarks.serve_load import commit, input_paths, machine


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--files", type=click.IntRange(1), default=8, show_default=True)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--beams", type=click.IntRange(2, 16), default=5, show_default=True)
@click.option("--gammas", default="2,4,7", show_default=True, help="γ values for speculative beams.")
@click.option("--max-new-tokens", type=click.IntRange(1, 224), default=224, show_default=True)
@click.option("--corpus", default="/tmp/corpus/heldout", show_default=True, help="A corpus split.")
@click.option("--source", default="asterisk:en", show_default=True)
def main(model, draft, files, repeats, beams, gammas, max_new_tokens, corpus, source) -> None:
    from specasr.audio import load_audio
    from specasr.cli.common import pair_loader
    from specasr.features import log_mel_window
    from specasr.options import DecodeOptions

    paths = input_paths((), corpus, source, files)
    pair = pair_loader(model, draft, "exact", None, None)()
    mels = [log_mel_window(load_audio(p), pair.n_mels) for p in paths]  # each [1, n_mels, 3000]
    base = DecodeOptions(language="en", timestamps=True, max_new_tokens=max_new_tokens, gamma_policy="fixed")
    configs = {
        "greedy, target only": replace(base, mode="autoregressive"),
        "greedy, exact (auto γ)": replace(base, mode="exact", gamma_policy="auto"),
        f"beam {beams}, target only": replace(base, mode="autoregressive", beam_size=beams),
    }
    for g in (int(x) for x in gammas.split(",")):
        configs[f"beam {beams}, speculative γ={g}"] = replace(
            base, mode="exact", beam_size=beams, gamma=g, speculative_beams=True
        )
    configs[f"beam {beams}, speculative, auto γ (backoff)"] = replace(
        base, mode="exact", beam_size=beams, gamma_policy="auto", speculative_beams=True
    )
    times = {name: [] for name in configs}
    tokens, passes = {}, {}
    decode_all(pair, mels[:1], configs[f"beam {beams}, target only"])  # warm-up
    for _ in range(repeats):
        for name, opts in configs.items():
            seconds, toks, stats = decode_all(pair, mels, opts)
            times[name].append(seconds)
            tokens[name], passes[name] = toks, stats.target_calls
    reference = f"beam {beams}, target only"
    ref_s = statistics.median(times[reference])
    print(f"# {machine()}; commit {commit()}; {len(mels)} windows, {model} + {draft}; {repeats} repeats")
    print(
        "| configuration | decoder s (median) | × target-only beams | target passes | = target-only beams |"
    )
    print("|---|---|---|---|---|")
    for name in configs:
        s = statistics.median(times[name])
        same = "yes" if tokens[name] == tokens[reference] else "no"
        print(f"| {name} | {s:.2f} | {s / ref_s:.2f} | {passes[name]} | {same} |")


if __name__ == "__main__":
    main()
