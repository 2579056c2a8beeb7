"""Compile every verifier kernel for sm_80 and sm_90 without a GPU, and report resources.

    python -m specasr.kernels.compile_check        # markdown table for docs/benchmarks.md

`triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))` needs no device. Register
and spill counts come from running the bundled ptxas with -v on the generated PTX (the
compiled kernel's n_regs / n_spills are only filled in when it is loaded onto a GPU); shared
memory is Triton's own allocation, `metadata.shared`.
"""

import re
import subprocess
import tempfile
from pathlib import Path

from . import exact_triton
from ._common import next_pow2

ARCHS = (80, 90)
DTYPES = ("fp16", "bf16", "fp32")
V = 51865  # Whisper's multilingual vocabulary


def _variants(dtypes=DTYPES, gammas=(5, 20)):
    """(label, kernel, signature, constexprs) for the kernel specialisations the wrapper launches."""
    n_lse, n_res = -(-V // exact_triton.BLOCK_LSE), -(-V // exact_triton.BLOCK_RES)
    i32 = "i32"
    for dt in dtypes:
        logits = f"*{dt}"
        for gamma in gammas:
            rows = next_pow2(gamma + 1)
            yield (
                f"greedy {dt} γ≤{rows - 1}",
                exact_triton._greedy_kernel,
                {"target_ptr": logits, "tokens_ptr": "*i64", "part_ptr": "*fp32", "counter_ptr": "*i32",
                 "n_out_ptr": "*i64", "next_out_ptr": "*i64", "V": i32, "G": i32, "N_TILES": i32,
                 "stride_tb": i32, "stride_tr": i32, "stride_kb": i32,
                 "BLOCK_V": "constexpr", "ROWS": "constexpr", "TILES": "constexpr"},
                {"BLOCK_V": exact_triton.BLOCK_LSE, "ROWS": rows, "TILES": next_pow2(n_lse)},
            )  # fmt: skip
            for sigmoid in (False, True):
                yield (
                    f"{'sigmoid' if sigmoid else 'residual'} {dt} γ≤{rows - 1}",
                    exact_triton._residual_kernel,
                    {"target_ptr": logits, "draft_ptr": logits, "tokens_ptr": "*i64", "uniforms_ptr": "*fp32",
                     "noise_ptr": "*fp32", "lse_ptr": "*fp32", "race_ptr": "*fp32", "counter_ptr": "*i32",
                     "n_out_ptr": "*i64", "next_out_ptr": "*i64",
                     "temperature": "fp32", "alpha": "fp32", "beta": "fp32",
                     "V": i32, "G": i32, "N_LSE": i32, "N_TILES": i32,
                     **{s: i32 for s in ("stride_tb", "stride_tr", "stride_db", "stride_dr", "stride_kb",
                                         "stride_ub", "stride_nb", "stride_nr")},
                     **{c: "constexpr" for c in ("BLOCK_V", "ROWS", "LSE_TILES", "TILES", "N_RACE",
                                                 "SIGMOID")}},
                    {"BLOCK_V": exact_triton.BLOCK_RES, "ROWS": rows, "LSE_TILES": next_pow2(n_lse),
                     "TILES": next_pow2(n_res), "N_RACE": exact_triton.N_RACE, "SIGMOID": sigmoid},
                )  # fmt: skip
        yield (
            f"lse {dt}",
            exact_triton._lse_kernel,
            {"target_ptr": logits, "draft_ptr": logits, "lse_ptr": "*fp32", "temperature": "fp32",
             "V": i32, "G": i32, "N_TILES": i32,
             "stride_tb": i32, "stride_tr": i32, "stride_db": i32, "stride_dr": i32, "BLOCK_V": "constexpr"},
            {"BLOCK_V": exact_triton.BLOCK_LSE},
        )  # fmt: skip


def _ptxas(cc: int) -> str:
    """The ptxas Triton itself uses for this arch (newer Tritons ship a second one for sm_90+)."""
    from triton.backends.nvidia import compiler

    if hasattr(compiler, "get_ptxas"):
        return compiler.get_ptxas(cc).path
    from triton import knobs

    return knobs.nvidia.ptxas.path


def _ptxas_resources(ptx: str, cc: int) -> dict[str, int]:
    arch = re.search(r"\.target\s+(sm_\w+)", ptx).group(1)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        log = subprocess.run(
            [_ptxas(cc), "-v", f"--gpu-name={arch}", str(src), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
    count = lambda pattern: int(re.search(pattern, log).group(1))  # noqa: E731
    return {
        "regs": count(r"Used (\d+) registers"),
        "spill_bytes": count(r"(\d+) bytes spill stores") + count(r"(\d+) bytes spill loads"),
    }


def compile_all(archs=ARCHS, dtypes=DTYPES, gammas=(5, 20), load: bool = False) -> list[dict]:
    """Compile each variant for each arch; one row per (variant, arch). Raises on a compile error.

    load: also load each kernel onto the current GPU and record Triton's own n_regs / n_spills.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rows = []
    for label, fn, signature, constexprs in _variants(dtypes, gammas):
        for cc in archs:
            compiled = triton.compile(
                ASTSource(fn, signature, constexprs=constexprs),
                target=GPUTarget("cuda", cc, 32),
                options={"num_warps": exact_triton.NUM_WARPS},
            )
            rows.append({
                "kernel": label, "arch": f"sm_{cc}", "num_warps": compiled.metadata.num_warps,
                "shared": compiled.metadata.shared, **_ptxas_resources(compiled.asm["ptx"], cc),
            })  # fmt: skip
            if load:
                compiled._init_handles()
                rows[-1]["loaded"] = f"n_regs={compiled.n_regs} n_spills={compiled.n_spills}"
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| kernel | arch | warps | registers/thread | shared memory (B) | spills (B) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    lines += [
        f"| {r['kernel']} | {r['arch']} | {r['num_warps']} | {r['regs']} | {r['shared']} "
        f"| {r['spill_bytes']} |"
        for r in rows
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    if "--load" in sys.argv:  # on a GPU: cross-check with the loaded kernels' metadata
        import torch

        cc = torch.cuda.get_device_capability()
        for row in compile_all(archs=(cc[0] * 10 + cc[1],), load=True):
            print(row)
    else:
        print(markdown(compile_all()))
