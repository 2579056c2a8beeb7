"""The device loop's γ on the product path, for a lent GPU: which fixed γ (or adaptive policy)
`transcribe` should draft with, end to end.

    python -m benchmarks.device_gamma --device cuda --repeats 5 [--gammas 2,3,4,5,6,7]
        [--workloads sequential,chunked,clips]

Three workloads, each with `transcribe`'s defaults (timestamps, prompts from the text
before, `en`): the long-form fixture (`benchmarks.longform.long_recording`, 75 s) sequential,
the same chunked in batches of 8 windows, and the 5 LibriVox clips one after another. For
each, autoregressive and exact at every fixed γ and two adaptive policies run once as a
warm-up (capturing their graphs), then `repeats` times; a row is the median wall time (the
device synchronised around each run), its ratio to autoregressive, and whether its tokens
equal autoregressive's. Autoregressive runs at its natural width (one-token passes: its own
speed); each γ at its own matched width, γ + 1, so an fp16 near-tie can still make a row's
tokens differ (`DecodeOptions.device_width`). Session 25's run on an H200 chose
`graphed.DEVICE_GAMMA_TIMESTAMPS`. On a CPU (the host loop, not the device loop) it runs too,
slowly: a check of the script.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import click


def _policies(gammas: list[int]) -> dict[str, dict]:
    out: dict[str, dict] = {"autoregressive": {"mode": "autoregressive", "device_width": "natural"}}
    for g in gammas:
        out[f"exact, fixed γ {g}"] = {"mode": "exact", "gamma": g, "gamma_policy": "fixed"}
    for g in (3, 5):
        adaptive = {"gamma_policy": "adaptive", "gamma_max": 8}
        out[f"exact, adaptive γ {g}…8"] = {"mode": "exact", "gamma": g, **adaptive}
    return out


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--device", default="cuda", show_default=True)
@click.option("--gammas", default="2,3,4,5,6,7", show_default=True, help="Comma-separated fixed γ.")
@click.option("--repeats", type=int, default=5, show_default=True)
@click.option(
    "--workloads",
    default="sequential,chunked,clips",
    show_default=True,
    help="Comma-separated: sequential, chunked (B = 8), clips.",
)
@click.option(
    "--data", type=click.Path(exists=True, file_okay=False), default="tests/data", show_default=True
)
def main(model, draft, device, gammas, repeats, workloads, data) -> None:
    import torch

    from benchmarks.longform import SAMPLE_RATE, fixture_clips, long_recording
    from specasr.models.loading import load_pair
    from specasr.options import TranscribeOptions
    from specasr.transcription import transcribe

    if repeats < 1:
        raise click.BadParameter("need at least 1", param_hint="'--repeats'")
    kinds = [k.strip() for k in workloads.split(",") if k.strip()]
    if not kinds or set(kinds) - {"sequential", "chunked", "clips"}:
        hint = "'--workloads'"
        raise click.BadParameter(f"{workloads!r}: name sequential, chunked or clips", param_hint=hint)
    pair = load_pair(model, draft, device=device)
    rec = long_recording(data)
    clips = [x for x, _ in fixture_clips(data)]
    base = TranscribeOptions(cut_search=10.0).with_decode(language="en")
    sync = torch.cuda.synchronize if pair.device.type == "cuda" else (lambda: None)

    def tokens(audio, options) -> list[list[int]]:
        segments, _ = transcribe(audio, pair, options, source_rate=SAMPLE_RATE)
        return [s.tokens for s in segments]

    def run(kind: str, options) -> list:
        if kind == "clips":
            return [tokens(x, options) for x in clips]
        return tokens(rec.samples, options)

    policies = _policies([int(g) for g in gammas.split(",") if g.strip()])
    click.echo(f"{model} + {draft} on {pair.device}, median of {repeats}\n")
    click.echo("| workload | decoding | wall s | vs autoregressive | same tokens |\n|---|---|---|---|---|")
    for kind in kinds:
        reference, ar = None, None
        for name, changes in policies.items():
            options = base.with_decode(**changes)
            if kind == "chunked":
                options = replace(options, strategy="chunked", batch_size=8)
            out = run(kind, options)  # the warm-up, which captures the graphs
            reference = out if reference is None else reference
            times = []
            for _ in range(repeats):
                sync()
                t0 = time.perf_counter()
                run(kind, options)
                sync()
                times.append(time.perf_counter() - t0)
            wall = statistics.median(times)
            ar = wall if ar is None else ar
            same = "yes" if out == reference else "NO"
            label = "chunked B=8" if kind == "chunked" else kind
            click.echo(f"| {label} | {name} | {wall:.4f} | {ar / wall:.2f}× | {same} |")


if __name__ == "__main__":
    main()
