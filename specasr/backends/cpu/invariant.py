"""Row-invariant attention for an int8 target: which product shape makes it so on this machine.

Speculative decoding is exact when the target's verify pass over k tokens scores each of
them as a one-token step would. In fp32 the two differ in the last bits (the products sum in
another order), which changes no greedy token in practice. An int8 target quantises every
activation row, and a last-bit difference that crosses a rounding boundary moves a value by
a whole quantisation step: the two passes then pick different tokens. So an int8 target's
decoder is built from pieces whose every row is bitwise the same whatever else shares the
pass: per-row int8 products (integer sums are exact, `specasr.backends.cpu.linear.Int8Linear`),
per-row layer norms and softmax, elementwise GELU, and attention products that always run
through one kernel (`specasr.backends.cpu.scripted.fixed_attend`).

BLAS libraries pick a kernel by shape: one query row goes through a matrix-vector kernel, a
few rows through small-matrix kernels, and from some row count on every row of a product is
computed by the same blocked GEMM with the same summation order. `fixed_rows()` finds that
count on this machine, with its thread count, by trying it: it checks, for each candidate,
that rows computed in calls of many shapes (1 to 40 query rows, one or two batch rows, the
448 self-attention keys and the 1500 cross-attention keys, given as Kᵀ as decoding gives
them) are bitwise those of one large call. With MKL on an AVX2 CPU it is 4. When no
candidate passes, an int8 target decodes autoregressively only (`specasr.decode.loop`).
"""

from __future__ import annotations

import functools

import torch

from specasr.backends.cpu.scripted import SELF_CHUNK, fixed_attend
from specasr.constants import N_TEXT_CTX

CANDIDATES = (4, 8, 16, 32)  # least query rows per attention product, tried in turn
# (keys, chunk): the self-attention cache in SELF_CHUNK products; encoder frames (a 30 s window)
_KEYS = ((N_TEXT_CTX, SELF_CHUNK), (1500, 0))


def _row_invariant(rows: int, keys: int, chunk: int, g: torch.Generator) -> bool:
    """Whether `fixed_attend(..., rows, chunk)` gives every row the same bits in calls of
    many shapes: 1 to 40 query rows, one or two batch rows, and with chunk > 0 (the
    self-attention cache) every key count from the part's greatest position up."""
    B, H, T, dh = 2, 8, 40, 64
    q = torch.randn(B, H, T, dh, generator=g) * 0.125  # [B, H, T, dh], scaled as the layers scale it
    K, V = torch.randn(2, B, H, keys, dh, generator=g)  # [B, H, N, dh] each
    pos = torch.randint(0, keys, (B, T), generator=g)  # a key position per query row
    pos[:, :20] %= 3 * max(chunk, 1)  # half the rows early in the cache, where passes read few chunks
    mask = (torch.arange(keys) <= pos[:, :, None]).unsqueeze(1)  # [B, 1, T, N]
    kt = chunk == 0  # cross-attention reads Kᵀ (`specasr.runtime.layers.DecoderLayer.cross_kv`)
    if kt:
        K = K.transpose(2, 3).contiguous()  # [B, H, dh, N]
    full = fixed_attend(q, K, V, mask, rows, chunk, kt)
    for b0, b1 in ((0, 2), (1, 2), (0, 1)):
        for t0, t1 in ((0, 1), (5, 6), (3, 5), (9, 12), (7, 15), (10, 19), (12, 25), (2, 40)):
            n = keys
            if chunk:  # the part's greatest length, rounded up to whole chunks
                n = min(keys, (int(pos[b0:b1, t0:t1].max()) + chunk) // chunk * chunk)
            Kp = K[b0:b1] if kt else K[b0:b1, :, :n]  # (n = N for cross-attention)
            part = fixed_attend(
                q[b0:b1, :, t0:t1], Kp, V[b0:b1, :, :n], mask[b0:b1, :, t0:t1, :n], rows, chunk, kt
            )
            if not torch.equal(part, full[b0:b1, :, t0:t1]):
                return False
    return True


@functools.cache
def fixed_rows() -> int:
    """The least query rows per attention product that make this machine's attention
    row-invariant (the first of CANDIDATES that passes `_row_invariant` for both key
    counts), or 0 when none does. Checked once per process, in a few milliseconds."""
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows in CANDIDATES:
            if all(_row_invariant(rows, keys, chunk, g) for keys, chunk in _KEYS):
                return rows
    return 0
