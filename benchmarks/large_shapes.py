"""What speculative decoding would gain at large-v3's size: pass costs on random weights.

    python -m benchmarks.large_shapes --device cuda --batch 1,16 [--alphas 0.7,0.8,0.9]

No large-v3 weights reach our machines, and a pass's cost depends on the shapes alone. So
this builds a target of large-v3's shapes (32 + 32 layers of width 1280, 20 heads, 128 mel
bins, 51866 tokens) and a draft of distil-large-v3's (its encoder, 2 decoder layers) with
random weights, in fp16 on a GPU, and measures what the device loop spends: the encoder on
one 30 s window, the target's pass over k tokens per row (k = 1 … 9) and the draft's pass
over one (`gpu.pass_costs`: CUDA graph replays). Acceptance cannot be measured on random
weights, so the speedup is a **projection**: `gamma.best_speedup` at each assumed per-token α
(no per-step overhead beyond the passes), for the decoder alone and for a window of
`--tokens` tokens with its encoder pass. `--shapes small` runs the same on a small stand-in
(the tests' CPU check).
"""

from __future__ import annotations

import statistics
import time

import click
import torch

from specasr.models.whisper import Whisper, WhisperDims

LARGE_V3 = dict(
    vocab_size=51866,
    num_mel_bins=128,
    d_model=1280,
    encoder_layers=32,
    decoder_layers=32,
    encoder_attention_heads=20,
    decoder_attention_heads=20,
    encoder_ffn_dim=5120,
    decoder_ffn_dim=5120,
)
DISTIL_DECODER_LAYERS = 2  # distil-large-v3: large-v3's encoder, 2 decoder layers
SMALL = dict(
    LARGE_V3,
    d_model=64,
    encoder_layers=1,
    decoder_layers=4,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=128,
    decoder_ffn_dim=128,
    vocab_size=1000,
)


def random_models(shapes: dict, device: torch.device, dtype: torch.dtype) -> tuple[Whisper, Whisper]:
    """(target, draft) with random weights: the draft's decoder has 2 layers and no encoder
    of its own to run (it reads the target's states, as distil-large-v3 shares large-v3's)."""
    torch.manual_seed(0)
    target = Whisper(WhisperDims(**shapes), device=device).to(dtype).eval().requires_grad_(False)
    draft_dims = WhisperDims(**dict(shapes, encoder_layers=1, decoder_layers=DISTIL_DECODER_LAYERS))
    draft = Whisper(draft_dims, device=device).to(dtype).eval().requires_grad_(False)
    return target, draft


@torch.inference_mode()
def encoder_ms(model: Whisper, batch: int, repeats: int) -> float:
    """Median milliseconds of one encoder pass over `batch` 30 s windows of random log-Mel."""
    dev = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    mel = torch.randn(batch, model.config.num_mel_bins, 3000, device=dev, dtype=dtype)
    model.encoder(mel)  # warm-up: kernels chosen, memory allocated
    runs = []
    for _ in range(repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        model.encoder(mel)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        runs.append((time.perf_counter() - t) * 1e3)
    return statistics.median(runs)


def projection(alpha: float, c: float, v: dict[int, float], enc: float, t1: float, tokens: int):
    """-> (decoder speedup bound, its γ, window speedup): the decoder's `best_speedup`, and a
    window's (encoder + `tokens` target steps) against (encoder + the same tokens speculated)."""
    from specasr.decode.gamma import best_speedup

    bound, g = best_speedup(alpha, c, v)
    return bound, g, (enc + tokens * t1) / (enc + tokens * t1 / bound)


def table(
    batches: list[int], shapes: dict, device: torch.device, alphas: list[float], tokens: int, reps: int
) -> str:
    from benchmarks.gpu import pass_costs

    target, draft = random_models(shapes, device, torch.float16 if device.type == "cuda" else torch.float32)
    lines = []
    for B in batches:
        enc = encoder_ms(target, B, 5)
        states = torch.randn(B, 1500, shapes["d_model"], device=device, dtype=target.proj_out.weight.dtype)
        t, d = pass_costs(target, draft, states, reps)
        c, v = d / t[1], {k: x / t[1] for k, x in t.items()}
        curve = ", ".join(f"{k}: {x:.2f}" for k, x in v.items())
        lines += [
            f"| B = {B} | |",
            "|---|---|",
            f"| encoder, {B} window(s) of 30 s | {enc:.2f} ms |",
            f"| target pass over 1 token per row | {t[1] * 1e3:.0f} µs |",
            f"| draft pass over 1 token per row | {d * 1e3:.0f} µs (c = {c:.3f}) |",
            f"| v(k) = target(k) ÷ target(1) | {curve} |",
        ]
        for a in alphas:
            bound, g, window = projection(a, c, v, enc, t[1], tokens)
            lines.append(
                f"| projected at per-token α {a:.2f} | decoder {bound:.2f}× at γ {g} (matched-width "
                f"target-only steps cost v({g + 1}) = {v[g + 1]:.2f}); a window of {tokens} tokens "
                f"{window:.2f}× |"
            )
        lines.append("")
        del states
    return "\n".join(lines)


@click.command()
@click.option("--device", default="cuda", show_default=True)
@click.option("--batch", default="1,16", show_default=True, help="Comma-separated rows per pass.")
@click.option("--alphas", default="0.7,0.8,0.9", show_default=True, help="Assumed per-token acceptance.")
@click.option("--tokens", type=int, default=100, show_default=True, help="Tokens in a projected window.")
@click.option("--repeats", type=int, default=0, help="Replays per timing (0: 100 on CUDA, 2 on a CPU).")
@click.option("--shapes", type=click.Choice(["large-v3", "small"]), default="large-v3", show_default=True)
def main(device, batch, alphas, tokens, repeats, shapes) -> None:
    dev = torch.device(device)
    reps = repeats or (100 if dev.type == "cuda" else 2)
    name = "large-v3 target, distil-large-v3 draft" if shapes == "large-v3" else "small stand-in"
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    click.echo(
        f"{name}, random weights, {gpu}, torch {torch.__version__}; projections, not measurements of α\n"
    )
    click.echo(
        table(
            [int(b) for b in batch.split(",")],
            LARGE_V3 if shapes == "large-v3" else SMALL,
            dev,
            [float(a) for a in alphas.split(",")],
            tokens,
            reps,
        )
    )


if __name__ == "__main__":
    main()
