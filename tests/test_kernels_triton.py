"""The Triton backend: interpreter runs on CPU (in child processes), and on CUDA when present.

On CUDA the whole issue grid runs against the references, plus the crafted cases, the
distribution test, and a check that `verify` never synchronises with the host.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kernel_cases import (
    DTYPES,
    check_crafted_triton,
    check_triton_matches_reference,
    crafted_cases,
    emitted_tv,
)
from specasr.kernels import MODES, verify
from specasr.kernels._common import HAS_TRITON

HERE = Path(__file__).parent
CHILD = HERE / "test_kernels_interpreted.py"
CUDA = torch.cuda.is_available() and HAS_TRITON
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


@pytest.mark.slow  # the interpreter in child processes, ~20 s on 2 cores; test_kernels_torch is the fast tier
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="cases run in-process")
def test_triton_kernels_under_interpreter():
    """Runs tests/test_kernels_interpreted.py with TRITON_INTERPRET=1, one shard per core (<= 2)."""
    shards = max(1, min(2, os.cpu_count() or 1))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CHILD)],
            env={**os.environ, "TRITON_INTERPRET": "1", "SPECASR_TEST_SHARD": f"{i}/{shards}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=HERE.parent,
        )
        for i in range(shards)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-6000:]
        passed = re.search(r"(\d+) passed", out)
        assert passed and int(passed.group(1)) >= 10, out[-2000:]  # the shard really ran


GRID = list(itertools.product((1, 2, 5), (1, 4, 7), (1000, 51864, 51865, 51866), DTYPES, (0.0, 0.7, 1.0)))


@needs_cuda
@pytest.mark.parametrize(("B", "G", "V", "dtype", "T"), GRID)
def test_cuda_matches_reference(B, G, V, dtype, T):
    check_triton_matches_reference(B, G, V, DTYPES[dtype], T, "cuda", seed=B + G + V)


@needs_cuda
@pytest.mark.parametrize("case", crafted_cases(), ids=lambda c: c.name)
def test_cuda_crafted_cases(case):
    check_crafted_triton(case, "cuda")


@needs_cuda
def test_cuda_exact_follows_target_distribution():
    from test_kernels_torch import N_DRAWS, P_LOGITS, Q_LOGITS, TV_BOUND

    def on_cuda(*inputs):
        n, nxt = verify(*(x.cuda() for x in inputs), temperature=1.0, mode="exact", backend="triton")
        return n.cpu(), nxt.cpu()

    assert max(emitted_tv(on_cuda, P_LOGITS, Q_LOGITS, N_DRAWS, seed=2)) < TV_BOUND


@needs_cuda
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("T", [0.0, 1.0])
def test_cuda_verify_never_synchronises(mode, T):
    from kernel_cases import random_batch

    inputs = random_batch(4, 5, 51865, torch.float16, T, seed=0, device="cuda")
    verify(*inputs, temperature=T, mode=mode)  # allocate the arrival counters, compile
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        n, nxt = verify(*inputs, temperature=T, mode=mode)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert n.is_cuda and nxt.is_cuda
