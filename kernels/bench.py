"""Verifier latency benchmark, and the sigmoid-approximation study.

    python -m specasr.kernels.bench                      # CUDA if present, else CPU
    python -m specasr.kernels.bench --device cpu --B 1 --gamma 5
    python -m specasr.kernels.bench --sigmoid-study [--logits pairs.pt]

Latency is the median per verify call: triton.testing.do_bench on CUDA (L2 flushed before
each call), warmed-up time.perf_counter on CPU. Modes run through `verify` with the default
backend (Triton on CUDA, torch on CPU); `baseline` is always the torch reference. Hugging
Face transformers' `_speculative_sampling` (batch 1 only, host-synchronising) is the extra
baseline where it imports. Inputs are Whisper-scale synthetic logits (see `synthetic_batch`).
"""

import argparse
import inspect
import statistics
import time

import torch

from . import make_randomness, verify
from .sigmoid import DEFAULT_SCALE, sigmoid_prob

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def synthetic_logits(N: int, V: int, generator: torch.Generator) -> torch.Tensor:
    """[N, V] fp32 logits shaped like Whisper's: a bulk around −2 (σ 3) and a few peaked tokens
    reaching +15..+30, so the softmax is confident, as in transcription."""
    z = 3.0 * torch.randn(N, V, generator=generator) - 2.0
    top = torch.randint(0, V, (N, 4), generator=generator)
    z.scatter_(1, top, 15.0 + 15.0 * torch.rand(N, 4, generator=generator))
    return z


def synthetic_batch(B: int, G: int, V: int, dtype: torch.dtype, T: float, device, seed: int = 0):
    """The five verify inputs; the draft is the target plus noise, drafts sampled from q."""
    g = torch.Generator().manual_seed(seed)
    target = synthetic_logits(B * (G + 1), V, g).view(B, G + 1, V)  # [B, G+1, V]
    draft = target[:, :G] + 1.0 * torch.randn(B, G, V, generator=g)  # [B, G, V]
    q = torch.softmax(draft / max(T, 1e-6), dim=-1)
    tokens = (q / torch.empty_like(q).exponential_(generator=g)).argmax(-1)  # [B, G] d ~ q
    uniforms, noise = make_randomness(B, G, V, g, device)
    return target.to(device, dtype), draft.to(device, dtype), tokens.to(device), uniforms, noise


def _hf_routine():
    """transformers' `_speculative_sampling(ids, draft_logits, γ, target_logits, ...)`, or None."""
    try:
        from transformers.generation.utils import _speculative_sampling
    except ImportError:
        return None
    if "is_done_candidate" in inspect.signature(_speculative_sampling).parameters:  # transformers < 5.2x
        return lambda *args: _speculative_sampling(*args, False)
    return _speculative_sampling


def _time_us(fn, device: str, budget_s: float = 0.5, graph: bool = False) -> float:
    if device == "cuda" and graph:  # replayed as a CUDA graph: GPU time without launch overhead
        from triton.testing import do_bench_cudagraph

        return 1e3 * do_bench_cudagraph(fn, rep=100, return_mode="median")
    if device == "cuda":
        from triton.testing import do_bench

        return 1e3 * do_bench(fn, warmup=25, rep=100, return_mode="median")
    for _ in range(3):
        fn()
    start = time.perf_counter()
    fn()
    reps = int(min(200, max(10, budget_s / max(time.perf_counter() - start, 1e-6))))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def bench(device: str, Bs, gammas, V: int, dtypes, T: float, graph: bool = False) -> list[dict]:
    hf = None if graph else _hf_routine()  # HF synchronises with the host: no graph capture
    rows = []
    for dtype in dtypes:
        for B in Bs:
            for G in gammas:
                target, draft, tokens, uniforms, noise = synthetic_batch(B, G, V, DTYPES[dtype], T, device)
                args = (target, draft, tokens, uniforms, noise)
                row = {"dtype": dtype, "B": B, "gamma": G}
                for mode in ("baseline", "exact", "sigmoid"):
                    call = lambda a=args, m=mode: verify(*a, temperature=T, mode=m)  # noqa: E731
                    row[mode] = _time_us(call, device, graph=graph)
                if hf is not None and B == 1:
                    ids = torch.cat([torch.zeros(1, 4, dtype=torch.long, device=device), tokens], 1)
                    call = lambda i=ids, d=draft, t=target, g=G: hf(i, d / T, g, t / T)  # noqa: E731
                    row["hf"] = _time_us(call, device)
                rows.append(row)
                print(_format_row(row), flush=True)
    return rows


HEADER = (
    "| dtype | B | γ | baseline (µs) | exact (µs) | sigmoid (µs) | HF `_speculative_sampling` (µs) "
    "| baseline / exact | baseline / sigmoid | exact / sigmoid |\n|---|---|---|---|---|---|---|---|---|---|"
)


def _format_row(r: dict) -> str:
    hf = f"{r['hf']:.1f}" if "hf" in r else "—"
    return (
        f"| {r['dtype']} | {r['B']} | {r['gamma']} "
        f"| {r['baseline']:.1f} | {r['exact']:.1f} | {r['sigmoid']:.1f} "
        f"| {hf} | {r['baseline'] / r['exact']:.2f}× | {r['baseline'] / r['sigmoid']:.2f}× "
        f"| {r['exact'] / r['sigmoid']:.2f} |"
    )


def acceptance_study(
    target_logits: torch.Tensor,  # [N, V] target logit rows
    draft_logits: torch.Tensor,  # [N, V] draft logit rows at the same positions
    *,
    temperature: float = 1.0,
    sigmoid_scale: tuple[float, float] = DEFAULT_SCALE,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """What p̂/q̂ does compared with p/q on paired logit rows (one drafted token per row).

    Drafts d ~ q are sampled per row. Returns the mean acceptance probability of one draft,
    E_d[min(1, p(d)/q(d))] for exact and the same with p̂/q̂ for sigmoid, the spread of the
    scaled argument and of p̂, and the total-variation distance between p and the
    distribution that sigmoid sampling draws its bonus token from, p̂ / Σp̂.
    """
    alpha, beta = sigmoid_scale
    z_t = target_logits.float() / temperature
    z_s = draft_logits.float() / temperature
    p, q = torch.softmax(z_t, -1), torch.softmax(z_s, -1)
    p_hat, q_hat = sigmoid_prob(z_t, alpha, beta), sigmoid_prob(z_s, alpha, beta)
    d = torch.multinomial(q, 1, generator=generator)  # [N, 1] drafts from q
    accept_exact = (p.gather(1, d) / q.gather(1, d)).clamp(max=1)
    accept_sigmoid = (p_hat.gather(1, d) / q_hat.gather(1, d)).clamp(max=1)
    finite = torch.isfinite(z_t)
    u = (z_t.clamp(alpha, beta) - alpha) / (beta - alpha)
    bonus = p_hat / p_hat.sum(-1, keepdim=True)
    return {
        "accept_exact": accept_exact.mean().item(),
        "accept_sigmoid": accept_sigmoid.mean().item(),
        "u_min": u[finite].min().item(),
        "u_max": u[finite].max().item(),
        "p_hat_min": p_hat[finite].min().item(),
        "p_hat_max": p_hat[finite].max().item(),
        "p_top1_mean": p.max(-1).values.mean().item(),
        "bonus_top1_mean": bonus.max(-1).values.mean().item(),
        "bonus_tv_to_p": 0.5 * (bonus - p).abs().sum(-1).mean().item(),
        "bonus_argmax_agrees": (bonus.argmax(-1) == p.argmax(-1)).float().mean().item(),
    }


def sigmoid_study(
    logits_path: str | None, T_values=(1.0, 0.7), scales=(DEFAULT_SCALE, (-30.0, 30.0))
) -> None:
    """Print p̂/q̂ vs p/q statistics for real paired logits (a torch file with [N, V] tensors
    under "target" and "draft") or for Whisper-scale synthetic ones."""
    g = torch.Generator().manual_seed(0)
    if logits_path:
        pairs = torch.load(logits_path)
        target, draft, source = pairs["target"].float(), pairs["draft"].float(), logits_path
    else:
        target = synthetic_logits(512, 51865, g)
        draft = target + 1.0 * torch.randn(target.shape, generator=g)
        source = "synthetic Whisper-scale logits, 512 rows, V = 51865"
    print(f"source: {source}")
    print("| T | (α, β) | accept exact | accept sigmoid | u range | p̂ range | mean max p | mean max p̂/Σp̂ "
          "| TV(p̂/Σp̂, p) | argmax agrees |\n|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for T in T_values:
        for scale in scales:
            s = acceptance_study(target, draft, temperature=T, sigmoid_scale=scale, generator=g)
            print(
                f"| {T} | ({scale[0]:g}, {scale[1]:g}) | {s['accept_exact']:.3f} | {s['accept_sigmoid']:.4f} "
                f"| [{s['u_min']:.4f}, {s['u_max']:.4f}] | [{s['p_hat_min']:.4f}, {s['p_hat_max']:.4f}] "
                f"| {s['p_top1_mean']:.3f} | {s['bonus_top1_mean']:.2e} | {s['bonus_tv_to_p']:.3f} "
                f"| {s['bonus_argmax_agrees']:.3f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--B", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--gamma", type=int, nargs="+", default=[1, 5, 10, 20])
    parser.add_argument("--V", type=int, default=51865)
    parser.add_argument("--dtype", nargs="+", default=["fp16", "fp32"], choices=DTYPES)
    parser.add_argument("--T", type=float, default=1.0, help="temperature (> 0: the sampling path)")
    parser.add_argument("--cudagraph", action="store_true", help="time CUDA-graph replays")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--sigmoid-study", action="store_true")
    parser.add_argument("--logits", help="torch file with paired 'target'/'draft' [N, V] logits")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sigmoid_study:
        sigmoid_study(args.logits)
        return
    name = (
        torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    )
    timing = "CUDA-graph replay" if args.cudagraph else "eager calls"
    print(
        f"device: {name}, {timing}, V = {args.V}, T = {args.T}, torch {torch.__version__}\n{HEADER}",
        flush=True,
    )
    bench(args.device, args.B, args.gamma, args.V, args.dtype, args.T, graph=args.cudagraph)


if __name__ == "__main__":
    main()
