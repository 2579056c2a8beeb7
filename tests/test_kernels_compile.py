"""Every Triton verifier kernel compiles for A100 (sm_80) and H100 (sm_90) with no GPU present,
without register spills. The full resource table is in docs/benchmarks.md
(`python -m specasr.kernels.compile_check`)."""

from __future__ import annotations

import pytest
from specasr.kernels._common import HAS_TRITON


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_kernels_compile_for_sm80_and_sm90_without_spills():
    from specasr.kernels.compile_check import compile_all

    rows = compile_all(archs=(80, 90), dtypes=("bf16", "fp32"), gammas=(5,))
    kernels = {r["kernel"].split()[0] for r in rows}
    assert kernels == {"greedy", "lse", "residual", "sigmoid"}
    assert {r["arch"] for r in rows} == {"sm_80", "sm_90"}
    spilled = [r for r in rows if r["spill_bytes"] > 0]
    assert not spilled, spilled
    assert all(0 < r["regs"] <= 255 for r in rows)
