"""A bf16 encoder's self-attention: the compiled library's (`bf16.Bf16Attention`, AVX512_BF16)
against torch's fp32 attention, which a bf16 encoder ran before, side by side.

    python -m benchmarks.encoder_attention --repeats 7

1. The attention alone on one 30 s window's shapes, [1, 1500, 64·H] q, k, v, for base (H = 8)
   and large-v3 (H = 20): torch's `scaled_dot_product_attention` in fp32 against the library's
   on the same values in bf16, alternating, after a warm-up; medians, the speed ratio, and
   each one's relative distance from the fp32 result.
2. The whole encoder of `--model` on the bundled example's window in three forms: fp32, bf16
   products with torch's fp32 attention (`bf16_encoder` with the library off, as before the
   kernel), and bf16 products with the library's attention (what `--compute-type bfloat16` /
   `int8_bfloat16` load now); medians of alternating rounds, the ratio between the bf16
   forms, and each bf16 form's states' relative distance from fp32's.

Prints the machine, the commit and the command (a docs/benchmarks.md stamp) and markdown
tables. Needs a CPU with AVX512_BF16 and a C++ compiler (else it says so and exits 1).
"""

from __future__ import annotations

import copy
import os
import statistics
import time

import click

from benchmarks.serve_load import commit, machine

SHAPES = {"base (H = 8)": 8, "large-v3 (H = 20)": 20}


def timed(run, repeats: int) -> list[float]:
    """Wall seconds of `run()` once per round."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        out.append(time.perf_counter() - start)
    return out


def distance(got, want) -> float:
    """‖got − want‖ / ‖want‖ in fp32."""
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def bf16_forms(encoder):
    """(torch's fp32 attention, the library's) bf16 forms of `encoder`, each a copy."""
    from specasr.backends.cpu.bf16 import bf16_encoder

    before = os.environ.get("SPECASR_FUSED_DRAFT")
    os.environ["SPECASR_FUSED_DRAFT"] = "0"  # read at conversion: the layers keep torch's attention
    try:
        plain = bf16_encoder(copy.deepcopy(encoder))
    finally:
        if before is None:
            del os.environ["SPECASR_FUSED_DRAFT"]
        else:
            os.environ["SPECASR_FUSED_DRAFT"] = before
    return plain, bf16_encoder(copy.deepcopy(encoder))


@click.command()
@click.option("--model", default="base", show_default=True, help="Its encoder, loaded in fp32.")
@click.option("--repeats", type=click.IntRange(1), default=7, show_default=True)
def main(model: str, repeats: int) -> None:
    import torch
    import torch.nn.functional as F

    from specasr.audio import load_audio
    from specasr.backends.cpu.bf16 import Bf16Attention
    from specasr.features import log_mel_window
    from specasr.models.loading import load_pair

    if Bf16Attention.of(8, 512) is None:
        raise SystemExit("no compiled bf16 attention here (a CPU without AVX512_BF16, or no C++ compiler)")
    print(f"machine: {machine()}, {torch.get_num_threads()} threads · commit: {commit()}")
    columns = ("attention, one window", "torch fp32 ms", "library bf16 ms", "speed")
    print("\n| " + " | ".join(columns) + " | distance: torch bf16 | library |")
    print("|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for name, heads in SHAPES.items():
            q, k, v = (torch.randn(1, 1500, 64 * heads, generator=g) for _ in range(3))
            q *= 64**-0.5
            qb, kb, vb = (t.bfloat16() for t in (q, k, v))
            lib = Bf16Attention(heads, Bf16Attention.of(heads, 64 * heads).lib)

            def split(t, heads=heads):
                return t.view(1, 1500, heads, 64).transpose(1, 2)

            def torch_fp32(q=q, k=k, v=v, split=split):
                return F.scaled_dot_product_attention(split(q), split(k), split(v), scale=1.0)

            def merged(y):
                return y.transpose(1, 2).reshape(1, 1500, -1)

            want = merged(torch_fp32())
            rounded = merged(F.scaled_dot_product_attention(split(qb), split(kb), split(vb), scale=1.0))
            got = lib(qb, kb, vb)
            runs = {"torch": [], "library": []}
            torch_fp32(), lib(qb, kb, vb)  # warm-up
            for _ in range(repeats):
                runs["torch"] += timed(torch_fp32, 1)
                runs["library"] += timed(lambda qb=qb, kb=kb, vb=vb, lib=lib: lib(qb, kb, vb), 1)
            t, m = (statistics.median(runs[k]) * 1e3 for k in ("torch", "library"))
            print(
                f"| {name} | {t:.2f} | {m:.2f} | {t / m:.2f}× | {distance(rounded, want):.4f} "
                f"| {distance(got, want):.4f} |"
            )
        pair = load_pair(model, None, compute_type="float32")
        encoder = pair.target.model.encoder
        samples = load_audio("specasr/assets/example.wav")
        mel = log_mel_window(samples, pair.n_mels).reshape(1, pair.n_mels, -1)  # [1, n_mels, 3000]
        plain, fast = bf16_forms(encoder)
        forms = {"fp32": encoder, "bf16, torch's fp32 attention": plain, "bf16, library attention": fast}
        states = {name: form(mel) for name, form in forms.items()}  # and a warm-up
        runs = {name: [] for name in forms}
        for _ in range(repeats):
            for name, form in forms.items():
                runs[name] += timed(lambda form=form: form(mel), 1)
    print(f"\n| {model} encoder, one window | median s | speed vs the line above | distance from fp32 |")
    print("|---|---|---|---|")
    previous = None
    for name in forms:
        s = statistics.median(runs[name])
        ratio = "—" if previous is None else f"{previous / s:.2f}×"
        far = "—" if name == "fp32" else f"{distance(states[name], states['fp32']):.4f}"
        print(f"| {name} | {s:.3f} | {ratio} | {far} |")
        previous = s


if __name__ == "__main__":
    main()
