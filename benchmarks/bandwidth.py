"""How close is a decoder step to the machine's memory bandwidth? (issue 20)

    python -m benchmarks.bandwidth --model base --repeats 30

A one-token decoder step multiplies one row by every decoder weight once, so on a CPU its
floor is the time to read those bytes from memory. This measures, in one process with the
same torch threads:

1. the bandwidth, with a STREAM-like probe on torch tensors far larger than the caches:
   copy (a = b), scale (a = s·b), add (a = b + c), triad (a = b + s·c), and read (sum(b)),
   each counted the way STREAM counts bytes (read + written), best and median of the
   repeats;
2. the target's pass over k = 1 … 8 new tokens (`benchmarks.speedup.step_costs`: the
   loop's own runner, decoder layers plus the output projection) and one draft step;
3. the bytes a target pass must read (`step_bytes`): every decoder layer's weights, the
   tied output projection once, and the window's cross-attention K/V (computed once per
   window, read by every step). Token lookups and the self-attention cache are a few rows.

It prints the achieved GB/s of the one-token step and of the k = 8 pass (the same bytes:
more rows reuse each weight read) as a fraction of the probe's read bandwidth, the verify
curve v(8) = pass(8) / pass(1), and the draft step as a fraction of the target step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import click

MB = 1e6


@dataclass(frozen=True)
class Probe:
    name: str
    best_gbs: float
    median_gbs: float


def stream_probe(mb: int = 256, repeats: int = 10) -> list[Probe]:
    """STREAM's four kernels plus a pure read, on float32 tensors of `mb` MB each."""
    import torch

    n = int(mb * MB) // 4
    a, b, c = torch.zeros(n), torch.rand(n), torch.rand(n)
    kernels = {  # name -> (kernel, bytes moved per call)
        "copy": (lambda: a.copy_(b), 2),
        "scale": (lambda: torch.mul(b, 3.0, out=a), 2),
        "add": (lambda: torch.add(b, c, out=a), 3),
        "triad": (lambda: torch.add(b, c, alpha=3.0, out=a), 3),
        "read": (lambda: b.sum(), 1),
    }
    out = []
    for name, (kernel, arrays) in kernels.items():
        kernel()  # first touch
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            kernel()
            times.append(time.perf_counter() - t0)
        moved = arrays * n * 4
        out.append(Probe(name, moved / min(times) / 1e9, moved / statistics.median(times) / 1e9))
    return out


def step_bytes(config, frames: int = 1500, element: int = 4, matrix_element: int = 4) -> dict[str, int]:
    """Bytes a target decoder pass reads, by part, for a Whisper config: the layers'
    matrices (`matrix_element` bytes each: 4 in fp32, 2 for the fp16-packed forms of few-row
    passes, 1 for an int8 target, whose per-row scales count as vectors) and vectors, the
    tied head once, and the cross-attention K/V of one window (fp32 in all)."""
    d, f, layers, m = config.d_model, config.decoder_ffn_dim, config.decoder_layers, matrix_element
    per_layer = (
        4 * d * d * m
        + 3 * d * element  # self-attention q, k, v, o (k has no bias)
        + 2 * d * d * m
        + 2 * d * element  # cross-attention q and o (its k, v are the cached K/V)
        + 2 * d * f * m
        + (f + d) * element  # feed-forward
        + 3 * 2 * d * element  # three layer norms
    )
    scales = (6 * d + f + d) * 4 if m == 1 else 0  # int8: one fp32 scale per output row
    return {
        "decoder layers": layers * (per_layer + scales),
        "output projection": config.vocab_size * d * m + (config.vocab_size * 4 if m == 1 else 0),
        "cross-attention K/V": layers * 2 * frames * d * element,
    }


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--repeats", type=int, default=30, show_default=True, help="Timed passes per k.")
@click.option("--probe-mb", type=int, default=256, show_default=True, help="MB per probe tensor.")
@click.option(
    "--data", type=click.Path(exists=True, file_okay=False), default="tests/data", show_default=True
)
@click.option(
    "--compute-type",
    type=click.Choice(["float32", "int8"]),
    default="float32",
    show_default=True,
    help="The target's products (the draft step is timed against the fp32 target).",
)
@click.option(
    "--half-weights", is_flag=True, help="Add the fp16-packed decoder forms (`load_pair(half_weights=True)`)."
)
def main(
    model: str, draft: str, repeats: int, probe_mb: int, data: str, compute_type: str, half_weights: bool
) -> None:
    from pathlib import Path

    import torch

    from benchmarks.speedup import step_costs
    from specasr.backends.cpu.linear import HalfPackedHead
    from specasr.eval.bench import file_mels
    from specasr.models.loading import load_pair

    int8 = compute_type == "int8"
    pair = load_pair(
        model, None if int8 else draft, device="cpu", compute_type=compute_type, half_weights=half_weights
    )
    threads = torch.get_num_threads()
    probes = stream_probe(probe_mb, max(5, repeats // 3))
    read = next(p for p in probes if p.name == "read")
    mel = file_mels(pair, sorted(Path(data).glob("*.wav"))[:1])[0]
    with torch.inference_mode():
        costs = step_costs(pair, mel, ks=(1, 2, 4, 8), repeats=repeats)
    # fp16-packed forms serve every pass measured here (k <= FEW_ROWS: `specasr.backends.cpu.linear`)
    half = isinstance(pair.target.proj_out, HalfPackedHead)
    parts = step_bytes(pair.target.config, matrix_element=1 if int8 else 2 if half else 4)
    total = sum(parts.values())
    click.echo(
        f"{model} + {pair.draft_name}, {compute_type} target{' (fp16-packed weights)' if half else ''}, "
        f"{threads} threads, {repeats} passes per k\n"
    )
    click.echo("| probe | best GB/s | median GB/s |\n|---|---|---|")
    for p in probes:
        click.echo(f"| {p.name} | {p.best_gbs:.1f} | {p.median_gbs:.1f} |")
    click.echo(
        "\nbytes per target pass: "
        + ", ".join(f"{k} {v / MB:.0f} MB" for k, v in parts.items())
        + f"; total {total / MB:.0f} MB\n"
    )
    click.echo("| pass | ms (median) | × one-token step | GB/s | of read bandwidth (best) |")
    click.echo("|---|---|---|---|---|")
    one = costs.target[1]
    for k, ms in costs.target.items():
        gbs = total / (ms / 1e3) / 1e9
        click.echo(f"| target, k = {k} | {ms:.2f} | {ms / one:.2f} | {gbs:.1f} | {gbs / read.best_gbs:.0%} |")
    if costs.draft is not None:
        click.echo(f"| draft step | {costs.draft:.2f} | {costs.draft / one:.2f} | – | – |")


if __name__ == "__main__":
    main()
