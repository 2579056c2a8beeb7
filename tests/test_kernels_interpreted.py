"""The Triton kernels on CPU under TRITON_INTERPRET=1, against the torch references.

The interpreter must be switched on before triton is first imported, so these tests run in
child processes started by `test_kernels_triton.py::test_triton_kernels_under_interpreter`
(sharded by SPECASR_TEST_SHARD="i/n"); in an ordinary run they are skipped. The subset
covers every value of the issue's grid (B in {1, 2, 5}, γ in {1, 4, 7}, V in {1000, 51864,
51865, 51866}, fp32/fp16/bf16, T in {0, 0.7, 1.0}) and pairs them up; the full grid runs on
CUDA. Tiles are enlarged to cut the interpreter's per-program cost, except in
`test_production_tiles`; partial last tiles and cross-tile reductions remain covered.
"""

from __future__ import annotations

import os

import pytest
import torch
from kernel_cases import DTYPES, check_crafted_triton, check_triton_matches_reference, crafted_cases

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [
    pytest.mark.skipif(not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child process"),
    # numpy reports the IEEE cases the kernels rely on: log(0) = −inf, 0/0 = NaN
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

# (B, γ, V, dtype, T)
CASES = [
    (1, 1, 1000, "fp32", 0.7),
    (2, 4, 1000, "fp16", 1.0),
    (5, 7, 1000, "bf16", 0.0),
    (2, 7, 51864, "fp32", 1.0),
    (5, 1, 51864, "fp16", 0.7),
    (1, 4, 51864, "bf16", 0.0),
    (1, 4, 51865, "bf16", 0.7),
    (5, 4, 51865, "fp32", 0.0),
    (5, 7, 51865, "fp16", 0.7),
    (1, 7, 51866, "fp16", 1.0),
    (2, 1, 51866, "bf16", 1.0),
    (2, 4, 51866, "fp32", 0.7),
]


def _shard(items):
    i, n = map(int, os.environ.get("SPECASR_TEST_SHARD", "0/1").split("/"))
    return [x for j, x in enumerate(items) if j % n == i]


@pytest.fixture(autouse=True)
def interpreter_tiles(monkeypatch):
    from specasr.kernels import exact_triton

    monkeypatch.setattr(exact_triton, "BLOCK_LSE", 16384)
    monkeypatch.setattr(exact_triton, "BLOCK_RES", 8192)


@pytest.mark.parametrize(("B", "G", "V", "dtype", "T"), _shard(CASES))
def test_triton_matches_reference(B, G, V, dtype, T):
    check_triton_matches_reference(B, G, V, DTYPES[dtype], T, "cpu", seed=B + G + V)


@pytest.mark.parametrize("case", _shard(crafted_cases()), ids=lambda c: c.name)
def test_crafted_cases_triton(case):
    check_crafted_triton(case, "cpu")


@pytest.mark.parametrize("T", _shard([0.0, 1.0]))
def test_production_tiles(T, monkeypatch):
    from specasr.kernels import exact_triton

    monkeypatch.setattr(exact_triton, "BLOCK_LSE", 4096)
    monkeypatch.setattr(exact_triton, "BLOCK_RES", 2048)
    check_triton_matches_reference(1, 2, 51865, torch.float16, T, "cpu", seed=11)


@pytest.mark.parametrize("mode", _shard(["exact", "sigmoid"]))
def test_noise_per_position_and_strided_logits(mode):
    """[B, G+1, V] noise selects row n; logits sliced from a wider buffer need no copy."""
    from kernel_cases import random_batch
    from specasr.kernels import verify

    B, G, V = 2, 4, 1000
    target, draft, tokens, uniforms, noise = random_batch(B, G, V, torch.float32, 1.0, seed=4)
    wide = torch.cat([target, torch.zeros(B, G + 1, 24)], -1)[..., :V]  # row stride V + 24
    noise3 = torch.rand(B, G + 1, V) + 0.5
    n, nxt = verify(wide, draft, tokens, uniforms, noise3, temperature=1.0, mode=mode, backend="triton")
    n_ref, nxt_ref = verify(
        target, draft, tokens, uniforms, noise3, temperature=1.0, mode=mode, backend="torch"
    )
    assert torch.equal(n, n_ref) and torch.equal(nxt, nxt_ref)


@pytest.mark.parametrize("V", _shard([1000, 51865]))
def test_the_coupled_rule_verifies_on_the_greedy_kernel(V):
    """The coupled rule (decode/race.py) hands verify the raced rows l / T + G at T = 0: the
    Triton kernel and the torch path accept exactly the drafts that are the target's race
    winners, and emit the winner at the first that is not (or the bonus position's)."""
    from specasr.kernels import verify

    from specasr.decode.race import KeyedRace

    B, G, T = 3, 4, 0.8
    logits = torch.randn(B, G + 1, V, generator=torch.Generator().manual_seed(V))
    rows = [b for b in range(B) for _ in range(G + 1)]
    positions = [i for _ in range(B) for i in range(G + 1)]
    raced = logits / T + KeyedRace(7, V, torch.device("cpu")).gumbel(rows, positions).view(B, G + 1, V)
    winners = raced.argmax(-1)  # [B, G+1]
    draft = winners[:, :G].clone()
    draft[0, 1] = (draft[0, 1] + 1) % V  # row 0 accepts one, row 1 none, row 2 all
    draft[1, 0] = (draft[1, 0] + 1) % V
    uniforms = torch.zeros(B, G)
    noise = torch.ones(B, V)
    q = torch.full((B, G, V), float("-inf"))
    expected = torch.tensor([1, 0, G])
    for backend in ("triton", "torch"):
        n, nxt = verify(raced, q, draft, uniforms, noise, temperature=0.0, mode="exact", backend=backend)
        assert torch.equal(n, expected)
        assert torch.equal(nxt, winners[torch.arange(B), expected])
