"""The `exact` verifier's fused Triton kernels for CUDA, and `launch`, their wrapper.

`launch` returns the same (n_accepted, next_token) as `reference.baseline` on the same inputs,
up to fp32 rounding in exp and in the log-sum-exp reduction order (the tests check equality).
The design (per-row log-sum-exp, a pass over V only for the sampled row pair, the exponential
race) is explained in `exact_torch`, the CPU path of the same mode; `sigmoid` reuses
`_residual_kernel` with SIGMOID=True.

Kernels (at most two launches per verify call; no host synchronisation):
  T > 0, launch 1  `_lse_kernel`, grid (B, 2G+1, cdiv(V, BLOCK_LSE)): one program per
                   (row, vocabulary tile) reads its tile once and writes the tile's
                   log-sum-exp. Work is spread over rows *and* tiles, so B = 1 fills the GPU.
  T > 0, launch 2  `_residual_kernel`, grid (B, cdiv(V, BLOCK_RES)): every program combines
                   the tile partials into lse_t, lse_s (a few hundred floats, from L2), gathers
                   the 2G logits at the drafted tokens, runs the ratio test, finds the first
                   rejection n, and races w / E over its tile of row n. The last program of
                   each batch row to arrive (atomic counter) reduces the per-tile race winners
                   and writes n and the token. `sigmoid` mode launches only this kernel.
  T = 0            `_greedy_kernel`, grid (B, G+1, cdiv(V, BLOCK_LSE)): tile argmax, then the
                   last program of each batch row matches the drafts and picks the token.

Bytes moved per call (s = logit itemsize; lower bound B(2G+1)V·s, every logit read once):
  launch 1 reads B(2G+1)V·s, writes B(2G+1)·cdiv(V, BLOCK_LSE)·4;
  launch 2 reads B·2V·s (target/draft row n, just read by launch 1, so mostly L2 hits),
  B·4V of fp32 noise (an input; the bound leaves it out), 2G gathered logits and the partials.
  Total ≈ B[(2G+3)V·s + 4V]: at G = 5, fp16, 1.18× the bound excluding the L2 re-read and
  1.36× counting it. The paper's code instead writes and re-reads p, q, p/q and p − q in
  fp32 for every row, about B(2G+1)V·(s + 16) bytes. Measured times and bandwidths are in
  docs/benchmarks.md.
"""

import torch

from ._common import HAS_TRITON, arrival_counters, next_pow2
from ._triton import _arrive, _scaled, _sigmoid_prob, tl, triton

BLOCK_LSE = 4096  # vocabulary tile of the read-everything kernels (launch 1, greedy)
BLOCK_RES = 2048  # vocabulary tile of the residual kernel: more programs for one row at B = 1
NUM_WARPS = 8
N_RACE = 5  # per-tile race partial: (max w/E, its index, max p/E, its index, max w)


@triton.jit
def _greedy_kernel(
    # pointers
    target_ptr,  # [B, G+1, V] logits
    tokens_ptr,  # [B, G] int64 drafted tokens
    part_ptr,  # [B, G+1, N_TILES, 2] fp32 workspace: (tile max, its index)
    counter_ptr,  # [>= B] int32, zero between calls
    n_out_ptr,  # [B] int64
    next_out_ptr,  # [B] int64
    # sizes
    V,
    G,
    N_TILES,
    # strides
    stride_tb,
    stride_tr,
    stride_kb,
    # meta
    BLOCK_V: tl.constexpr,
    ROWS: tl.constexpr,  # next_pow2(G + 1)
    TILES: tl.constexpr,  # next_pow2(N_TILES)
):
    b = tl.program_id(0).to(tl.int64)
    row = tl.program_id(1)
    tile = tl.program_id(2)
    offs = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    x = tl.load(target_ptr + b * stride_tb + row * stride_tr + offs, mask=offs < V, other=-float("inf"))
    x = x.to(tl.float32)
    part = part_ptr + ((b * (G + 1) + row) * N_TILES + tile) * 2
    tl.store(part, tl.max(x, axis=0))
    tl.store(part + 1, (tile * BLOCK_V + tl.argmax(x, axis=0, tie_break_left=True)).to(tl.float32))
    if _arrive(counter_ptr + b, (G + 1) * N_TILES):
        r = tl.arange(0, ROWS)
        t = tl.arange(0, TILES)
        valid = (r[:, None] <= G) & (t[None, :] < N_TILES)
        base = part_ptr + ((b * (G + 1) + r[:, None]) * N_TILES + t[None, :]) * 2
        best = tl.load(base, mask=valid, other=-float("inf"), cache_modifier=".cg")  # [ROWS, TILES]
        where = tl.load(base + 1, mask=valid, other=0.0, cache_modifier=".cg")
        best_tile = tl.argmax(best, axis=1, tie_break_left=True)  # [ROWS]; lowest tile on ties
        arg = tl.sum(tl.where(t[None, :] == best_tile[:, None], where, 0.0), axis=1).to(tl.int64)
        tok = tl.load(tokens_ptr + b * stride_kb + r, mask=r < G, other=-1)
        n = tl.min(tl.where((r < G) & (tok != arg), r, G), axis=0)
        tl.store(n_out_ptr + b, n.to(tl.int64))
        tl.store(next_out_ptr + b, tl.sum(tl.where(r == n, arg, 0), axis=0))
        tl.store(counter_ptr + b, 0)


@triton.jit
def _lse_kernel(
    # pointers
    target_ptr,  # [B, G+1, V] logits
    draft_ptr,  # [B, G, V] logits
    lse_ptr,  # [B, 2G+1, N_TILES] fp32 out: per-tile log-sum-exp of logits / T
    # scalars
    temperature,
    # sizes
    V,
    G,
    N_TILES,
    # strides
    stride_tb,
    stride_tr,
    stride_db,
    stride_dr,
    # meta
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row = tl.program_id(1)  # 0..G: target rows, G+1..2G: draft rows
    tile = tl.program_id(2)
    if row <= G:
        row_ptr = target_ptr + b * stride_tb + row * stride_tr
    else:
        row_ptr = draft_ptr + b * stride_db + (row - G - 1) * stride_dr
    offs = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    z = _scaled(tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")), temperature)
    m = tl.max(z, axis=0)
    m = tl.where(m == -float("inf"), 0.0, m)  # an all −inf tile has lse −inf, not NaN
    lse = m + tl.log(tl.sum(tl.exp(z - m), axis=0))
    tl.store(lse_ptr + (b * (2 * G + 1) + row) * N_TILES + tile, lse)


@triton.jit
def _combine_lse(lse_ptr, rows, valid, N_LSE, LSE_TILES: tl.constexpr):
    """Per-row log-sum-exp from the tile partials of `rows`: [ROWS]."""
    t = tl.arange(0, LSE_TILES)
    mask = valid[:, None] & (t[None, :] < N_LSE)
    part = tl.load(lse_ptr + rows[:, None] * N_LSE + t[None, :], mask=mask, other=-float("inf"))
    m = tl.max(part, axis=1)
    m = tl.where(m == -float("inf"), 0.0, m)
    return m + tl.log(tl.sum(tl.exp(part - m[:, None]), axis=1))


@triton.jit
def _residual_kernel(
    # pointers
    target_ptr,  # [B, G+1, V] logits
    draft_ptr,  # [B, G, V] logits
    tokens_ptr,  # [B, G] int64
    uniforms_ptr,  # [B, G] fp32
    noise_ptr,  # [B, V] or [B, G+1, V] fp32, Exp(1)
    lse_ptr,  # [B, 2G+1, N_LSE] fp32 from _lse_kernel (unused when SIGMOID)
    race_ptr,  # [B, N_TILES, N_RACE] fp32 workspace
    counter_ptr,  # [>= B] int32, zero between calls
    n_out_ptr,  # [B] int64
    next_out_ptr,  # [B] int64
    # scalars
    temperature,
    alpha,
    beta,
    # sizes
    V,
    G,
    N_LSE,
    N_TILES,
    # strides
    stride_tb,
    stride_tr,
    stride_db,
    stride_dr,
    stride_kb,
    stride_ub,
    stride_nb,
    stride_nr,  # 0 for [B, V] noise
    # meta
    BLOCK_V: tl.constexpr,
    ROWS: tl.constexpr,  # next_pow2(G + 1)
    LSE_TILES: tl.constexpr,  # next_pow2(N_LSE)
    TILES: tl.constexpr,  # next_pow2(N_TILES)
    N_RACE: tl.constexpr,
    SIGMOID: tl.constexpr,  # p̂, q̂ = sigmoids of scaled logits instead of softmax
):
    b = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    # Ratio test on the drafted tokens (every program repeats it: 2G gathers).
    i = tl.arange(0, ROWS)
    drafted = i < G
    tok = tl.load(tokens_ptr + b * stride_kb + i, mask=drafted, other=0)
    t_tok = _scaled(
        tl.load(target_ptr + b * stride_tb + i * stride_tr + tok, mask=drafted, other=0.0), temperature
    )
    s_tok = _scaled(
        tl.load(draft_ptr + b * stride_db + i * stride_dr + tok, mask=drafted, other=0.0), temperature
    )
    if SIGMOID:
        p_tok = _sigmoid_prob(t_tok, alpha, beta)
        q_tok = _sigmoid_prob(s_tok, alpha, beta)
        lse_t = tl.zeros([ROWS], dtype=tl.float32)
        lse_s = lse_t
    else:
        lse_b = lse_ptr + b * (2 * G + 1) * N_LSE
        lse_t = _combine_lse(lse_b, i, i <= G, N_LSE, LSE_TILES)  # [ROWS] target rows 0..G
        lse_s = _combine_lse(lse_b, i + G + 1, drafted, N_LSE, LSE_TILES)  # [ROWS] draft rows
        p_tok = tl.exp(t_tok - lse_t)
        q_tok = tl.exp(s_tok - lse_s)
    r = tl.load(uniforms_ptr + b * stride_ub + i, mask=drafted, other=0.0)
    rejected = drafted & ~(r <= tl.math.div_rn(p_tok, q_tok))
    n = tl.min(tl.where(rejected, i, G), axis=0)
    # Residual over this program's tile of row n (bonus row when n = G: no draft row, q = 0).
    offs = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    in_v = offs < V
    zt = tl.load(target_ptr + b * stride_tb + n * stride_tr + offs, mask=in_v, other=-float("inf"))
    s_lim = tl.where(n < G, V, 0)  # no draft row to read for the bonus token
    zs = tl.load(draft_ptr + b * stride_db + n * stride_dr + offs, mask=offs < s_lim, other=-float("inf"))
    zt = _scaled(zt, temperature)
    zs = _scaled(zs, temperature)
    if SIGMOID:
        p = _sigmoid_prob(zt, alpha, beta)
        q = _sigmoid_prob(zs, alpha, beta)
    else:
        p = tl.exp(zt - tl.sum(tl.where(i == n, lse_t, 0.0), axis=0))
        q = tl.exp(zs - tl.sum(tl.where(i == n, lse_s, 0.0), axis=0))
    w = tl.maximum(p - q, 0.0)
    e = tl.load(noise_ptr + b * stride_nb + n * stride_nr + offs, mask=in_v, other=1.0)
    key_w = tl.math.div_rn(w, e)
    key_p = tl.math.div_rn(p, e)
    part = race_ptr + (b * N_TILES + tile) * N_RACE
    tl.store(part, tl.max(key_w, axis=0))
    tl.store(part + 1, (tile * BLOCK_V + tl.argmax(key_w, axis=0, tie_break_left=True)).to(tl.float32))
    tl.store(part + 2, tl.max(key_p, axis=0))
    tl.store(part + 3, (tile * BLOCK_V + tl.argmax(key_p, axis=0, tie_break_left=True)).to(tl.float32))
    tl.store(part + 4, tl.max(w, axis=0))
    if _arrive(counter_ptr + b, N_TILES):
        t = tl.arange(0, TILES)
        valid = t < N_TILES
        base = race_ptr + (b * N_TILES + t) * N_RACE
        kw = tl.load(base, mask=valid, other=-1.0, cache_modifier=".cg")
        kp = tl.load(base + 2, mask=valid, other=-1.0, cache_modifier=".cg")
        w_max = tl.max(tl.load(base + 4, mask=valid, other=0.0, cache_modifier=".cg"), axis=0)
        at_w = tl.argmax(kw, axis=0, tie_break_left=True)
        at_p = tl.argmax(kp, axis=0, tie_break_left=True)
        tok_w = tl.load(race_ptr + (b * N_TILES + at_w) * N_RACE + 1, cache_modifier=".cg")
        tok_p = tl.load(race_ptr + (b * N_TILES + at_p) * N_RACE + 3, cache_modifier=".cg")
        tl.store(n_out_ptr + b, n.to(tl.int64))
        tl.store(next_out_ptr + b, tl.where(w_max > 0, tok_w, tok_p).to(tl.int64))
        tl.store(counter_ptr + b, 0)


INTERPRETED = type(_residual_kernel).__name__ == "InterpretedFunction"  # TRITON_INTERPRET=1


def _rows_unit_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def launch(
    target_logits: torch.Tensor,  # [B, G+1, V]
    draft_logits: torch.Tensor,  # [B, G, V]
    draft_tokens: torch.Tensor,  # [B, G] int64
    uniforms: torch.Tensor,  # [B, G]
    noise: torch.Tensor,  # [B, V] or [B, G+1, V]
    *,
    temperature: float,
    sigmoid_scale: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the Triton verifier: exact (sigmoid_scale None) or sigmoid; [B] int64 twice.

    Shapes and dtypes are those `_common.check_inputs` validates (`verify` calls it first);
    here the device is checked, rows get unit stride, and the outputs and workspaces are
    allocated without host synchronisation.
    """
    if not HAS_TRITON:
        raise RuntimeError("backend='triton' needs the triton package")
    if target_logits.device.type != "cuda" and not INTERPRETED:
        raise ValueError(
            "backend='triton' needs CUDA tensors, or TRITON_INTERPRET=1 set before triton is imported"
        )
    B, G = draft_tokens.shape
    V = target_logits.shape[-1]
    device = target_logits.device
    target_logits = _rows_unit_stride(target_logits)
    draft_logits = _rows_unit_stride(draft_logits)
    draft_tokens = draft_tokens.contiguous()
    n_out = torch.empty(B, dtype=torch.int64, device=device)
    next_out = torch.empty(B, dtype=torch.int64, device=device)
    counters = arrival_counters(device, B)
    n_lse = triton.cdiv(V, BLOCK_LSE)
    if temperature == 0:
        part = torch.empty(B * (G + 1) * n_lse * 2, dtype=torch.float32, device=device)
        _greedy_kernel[(B, G + 1, n_lse)](
            target_logits, draft_tokens, part, counters, n_out, next_out,
            V, G, n_lse,
            target_logits.stride(0), target_logits.stride(1), draft_tokens.stride(0),
            BLOCK_V=BLOCK_LSE, ROWS=next_pow2(G + 1), TILES=next_pow2(n_lse), num_warps=NUM_WARPS,
        )  # fmt: skip
        return n_out, next_out
    uniforms = uniforms.float().contiguous()
    noise = _rows_unit_stride(noise.float())
    sigmoid = sigmoid_scale is not None
    alpha, beta = sigmoid_scale if sigmoid else (0.0, 1.0)
    n_tiles = triton.cdiv(V, BLOCK_RES)
    n_part = 0 if sigmoid else B * (2 * G + 1) * n_lse
    work = torch.empty(n_part + B * n_tiles * N_RACE, dtype=torch.float32, device=device)
    lse, race_part = work[:n_part], work[n_part:]
    if not sigmoid:
        _lse_kernel[(B, 2 * G + 1, n_lse)](
            target_logits, draft_logits, lse,
            float(temperature),
            V, G, n_lse,
            target_logits.stride(0), target_logits.stride(1),
            draft_logits.stride(0), draft_logits.stride(1),
            BLOCK_V=BLOCK_LSE, num_warps=NUM_WARPS,
        )  # fmt: skip
    _residual_kernel[(B, n_tiles)](
        target_logits, draft_logits, draft_tokens, uniforms, noise, lse if not sigmoid else work,
        race_part, counters, n_out, next_out,
        float(temperature), float(alpha), float(beta),
        V, G, n_lse, n_tiles,
        target_logits.stride(0), target_logits.stride(1),
        draft_logits.stride(0), draft_logits.stride(1),
        draft_tokens.stride(0), uniforms.stride(0),
        noise.stride(0), noise.stride(1) if noise.dim() == 3 else 0,
        BLOCK_V=BLOCK_RES, ROWS=next_pow2(G + 1), LSE_TILES=next_pow2(n_lse), TILES=next_pow2(n_tiles),
        N_RACE=N_RACE, SIGMOID=sigmoid, num_warps=NUM_WARPS,
    )  # fmt: skip
    return n_out, next_out
