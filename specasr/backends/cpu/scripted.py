"""Decoder layers over a few new tokens, as TorchScript functions (CPU).

A decoder pass on CPU over 1–9 tokens is dozens of small products and views per layer, and
the Python around each op (module calls, views, reshapes) costs about as much as a small
product. Each function here is `specasr.runtime.layers.DecoderLayer.forward` for one kind
of layer, written as one scripted function, so the interpreter runs the ops without Python
between them:

- `int8_layer_step`: a distilled draft's layer after `DistilledDraft.quantize_int8`, or an
  int8 target's (`specasr.models.whisper.quantize_target`) (fbgemm int8 products,
  `specasr.backends.cpu.linear.Int8Linear`). Same ops, same order: bitwise the eager layer (tested).
- `fp32_layer_step`: a `specasr.runtime.runner.LeanDecoder` layer (the target on CPU), for passes
  of up to `specasr.backends.cpu.linear.MANY_ROWS` rows, where its products are x·Wᵀ with a
  contiguous Wᵀ. It agrees with the eager layer to about 1e-6 (tested): the target stays
  the target, as with the product forms of `specasr.backends.cpu.linear`.

Both are faster than the eager layers for one-token and few-token passes, by the Python
they remove; how much depends on the machine, so the measured times are in
docs/benchmarks.md ("Component timings behind the CPU code"), not here.

Both write this block's keys and values into the preallocated cache at `start` (or, for
ragged rows, at each row's own positions `write`) and attend over positions 0 … start+T-1,
like the eager layer. TorchScript is deprecated in recent
PyTorch: where scripting fails or is gone, `scripted` returns None and the layers stay
eager.
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from pathlib import Path
from typing import List, Optional, Union  # noqa: UP035 (TorchScript)

import torch
import torch.nn.functional as F
from torch import Tensor

from specasr.cache import default_cache_root, store


def _lin(x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:  # noqa: UP045 (TorchScript)
    """x [rows, in] -> [rows, out]: through oneDNN when w is a packed weight
    (`specasr.backends.cpu.linear.PackedLinear`), else x · Wᵀ with w = Wᵀ [in, out] contiguous
    (`specasr.backends.cpu.linear.TransposedLinear`); + b."""
    if w.dtype == torch.uint8:  # fbgemm's packed fp16 (`specasr.backends.cpu.linear.HalfPackedLinear`)
        assert b is not None  # the form always holds a bias (zeros when the layer has none)
        return torch.fbgemm_linear_fp16_weight_fp32_activation(x, w, b)
    if w.is_mkldnn:
        scalars = torch.jit.annotate(List[Optional[Union[int, float, complex]]], [])  # noqa: UP006, UP007, UP045
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", scalars, "")
    if b is None:
        return x @ w
    return torch.addmm(b, x, w)


def int8_product(
    x: Tensor,
    packed: torch.classes.quantized.LinearPackedParamsBase,
    b: Optional[Tensor],  # noqa: UP045 (TorchScript)
    per_row: bool,
) -> Tensor:
    """x [rows, in] -> [rows, out] through fbgemm's dynamic int8 product (`linear.Int8Linear`
    runs this too, eagerly): per call, the bias inside `packed`; or per row, each row scaled
    to max |x| = 1 with an anchor row [1, -1, 0, …] that makes fbgemm's range exactly
    [-1, 1] whatever the other rows hold, then rescaled in place (a fresh [rows, out] per op
    cost a third of the product at 1500 rows), + b."""
    if not per_row:
        return torch.ops.quantized.linear_dynamic(x, packed, True)
    a = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)  # [rows, 1]
    anchor = x.new_zeros(1, x.shape[1])
    anchor[0, 0], anchor[0, 1] = 1.0, -1.0
    y = torch.ops.quantized.linear_dynamic(torch.cat([x / a, anchor]), packed, False)[:-1]
    y.mul_(a)
    return y if b is None else y.add_(b)


def _norm(x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    """LayerNorm over d: [B, T, d] -> [B·T, d]."""
    d = x.shape[2]
    return F.layer_norm(x, [d], w, b, eps).reshape(x.shape[0] * x.shape[1], d)


def _heads(t: Tensor, B: int, heads: int) -> Tensor:
    """[B·T, d] -> [B, H, T, dh] (a view)."""
    return t.view(B, -1, heads, t.shape[1] // heads).transpose(1, 2)


def _merge(y: Tensor) -> Tensor:
    """[B, H, T, dh] -> [B·T, d]."""
    return y.transpose(1, 2).reshape(y.shape[0] * y.shape[2], y.shape[1] * y.shape[3])


def write_cache(
    k: Tensor,
    v: Tensor,
    K: Tensor,
    V: Tensor,
    start: int,
    write: Optional[Tensor],  # noqa: UP045 (TorchScript)
) -> None:
    """Writes a pass's keys and values k, v [B, H, T, dh] into the cache K, V [B, H, 448, dh]:
    at positions start … start+T-1, or for ragged rows at the scatter index `write`
    [B, H, T, dh] (each row's own positions)."""
    if write is None:
        T = k.shape[2]
        K[:, :, start : start + T] = k
        V[:, :, start : start + T] = v
    else:
        K.scatter_(2, write, k)
        V.scatter_(2, write, v)


def _self_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Optional[Tensor],  # noqa: UP045 (TorchScript)
    start: int,
    write: Optional[Tensor],  # noqa: UP045
) -> Tensor:
    """Writes k, v [B, H, T, dh] at positions start … start+T-1 of the cache K, V
    [B, H, 448, dh] (ragged rows: at the scatter index `write` [B, H, T, dh], with `start`
    the greatest row start) and attends over positions 0 … start+T-1 -> [B·T, d]."""
    T = q.shape[2]
    write_cache(k, v, K, V, start, write)
    return _merge(
        F.scaled_dot_product_attention(
            q, K[:, :, : start + T], V[:, :, : start + T], attn_mask=mask, scale=1.0
        )
    )


def fixed_attend(
    q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Optional[Tensor],  # noqa: UP045
    rows: int,
    chunk: int,
    kt: bool = False,
) -> Tensor:
    """Attention whose every query row is computed bitwise alike however many rows and
    batch rows share the call: q [B, H, T, dh] (scaled), K, V [B, H, N, dh], mask None or
    [B or 1, 1, T, N] bool (True = attend) -> [B, H, T, dh]. kt: K is given as Kᵀ
    [B, H, dh, N], contiguous (cross-attention, `DecoderLayer.cross_kv(kt=True)`): the scores
    are then a plain product, faster than over a transposed view (measured: docs/benchmarks.md).

    A BLAS product's summation order depends on its shape: one query row goes through a
    matrix-vector kernel, a few more through small-matrix kernels, and from some row count
    on every row through the same blocked GEMM. `rows` is that count for this machine's BLAS
    (`specasr.backends.cpu.invariant.fixed_rows` finds it): fewer query rows are padded with zero
    rows up to it. chunk = 0: N is the same in every call (cross-attention's 1500 frames).
    chunk > 0 (self-attention, N a multiple of it, keys past a row's position masked): the
    scores and softmax of a row do not depend on N (masked keys weigh exactly 0), but the
    weights-by-values product's blocking does, so it runs as one product per `chunk` keys,
    summed in key order: a row's chunks past its position add exact zeros. So a k-token
    verify pass gives each row the bits a one-token step at that position gives (tested on
    real weights)."""
    T = q.shape[2]
    n = max(T, rows)
    pad = n > T  # a pass of `rows` or more query rows (a window's first pass) pads and copies nothing
    s = (F.pad(q, [0, 0, 0, n - T]) if pad else q) @ (K if kt else K.transpose(2, 3))  # [B, H, n, N]
    s = s[:, :, :T] if pad else s
    if mask is not None:
        s = s.masked_fill_(mask.logical_not(), float("-inf"))  # s is this call's own
    p = torch.softmax(s, dim=-1)
    p = F.pad(p, [0, 0, 0, n - T]) if pad else p  # [B, H, n, N]
    if chunk == 0:
        return (p @ V)[:, :, :T]
    y = p[:, :, :, :chunk] @ V[:, :, :chunk]  # [B, H, n, dh]
    for c in range(chunk, K.shape[2], chunk):
        y = y + p[:, :, :, c : c + chunk] @ V[:, :, c : c + chunk]
    return y[:, :, :T]


SELF_CHUNK = 64  # keys per self-attention product of an int8 target (`fixed_self_attend`)


def fixed_mask(pos: Tensor, cache: int) -> Tensor:
    """The self-attention mask of an int8 target's pass: pos [B or 1, T], each query's
    position -> [B or 1, 1, T, N] bool (True = attend), N the pass's greatest length rounded
    up to SELF_CHUNK, at most `cache` (448 = 7 · 64)."""
    N = min(cache, (int(pos.max()) + SELF_CHUNK) // SELF_CHUNK * SELF_CHUNK)
    return (torch.arange(N, device=pos.device) <= pos.unsqueeze(2)).unsqueeze(1)


def fixed_self_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor,
    start: int,
    write: Optional[Tensor],  # noqa: UP045
    rows: int,
) -> Tensor:
    """`_self_attend` for an int8 target, through `fixed_attend`: writes k, v into the
    cache as `_self_attend` does, then each query attends over the cache's first N
    positions, mask [B or 1, 1, T, N] (`fixed_mask`, built once per pass), with every
    position past its own masked (stale keys of rolled-back tokens weigh 0)."""
    N = mask.shape[3]
    write_cache(k, v, K, V, start, write)
    return _merge(fixed_attend(q, K[:, :, :N], V[:, :, :N], mask, rows, 64))  # 64: SELF_CHUNK


def fp32_layer_step(
    x: Tensor,  # [B, T, d] at positions start … start+T-1, B·T ≤ MANY_ROWS
    ln1_w: Tensor,
    ln1_b: Tensor,
    wq: Tensor,  # every w: oneDNN-packed, or Wᵀ [in, out] contiguous; every b: [out] or None
    bq: Optional[Tensor],  # noqa: UP045
    wk: Tensor,
    bk: Optional[Tensor],  # noqa: UP045
    wv: Tensor,
    bv: Optional[Tensor],  # noqa: UP045
    wo: Tensor,
    bo: Optional[Tensor],  # noqa: UP045
    ln2_w: Tensor,
    ln2_b: Tensor,
    cwq: Tensor,
    cbq: Optional[Tensor],  # noqa: UP045
    cwo: Tensor,
    cbo: Optional[Tensor],  # noqa: UP045
    ln3_w: Tensor,
    ln3_b: Tensor,
    w1: Tensor,
    b1: Optional[Tensor],  # noqa: UP045
    w2: Tensor,
    b2: Optional[Tensor],  # noqa: UP045
    K: Tensor,  # [B, H, 448, dh] self-attention cache
    V: Tensor,
    cross_k: Tensor,  # [B, H, S, dh]
    cross_v: Tensor,
    mask: Optional[Tensor],  # noqa: UP045  [T, start+T] or [B, 1, T, start+T] bool; None: T == 1
    start: int,
    write: Optional[Tensor],  # noqa: UP045  ragged rows: cache positions [B, H, T, dh]
    heads: int,
    eps: float,
) -> Tensor:
    """x [B, T, d] -> [B, T, d]: pre-norm self-attention, cross-attention and GELU MLP."""
    B, shape = x.shape[0], x.shape
    scale = float(x.shape[2] // heads) ** -0.5
    h = _norm(x, ln1_w, ln1_b, eps)
    q, k, v = _lin(h, wq, bq) * scale, _lin(h, wk, bk), _lin(h, wv, bv)
    y = _self_attend(_heads(q, B, heads), _heads(k, B, heads), _heads(v, B, heads), K, V, mask, start, write)
    x = x + _lin(y, wo, bo).view(shape)
    q = _heads(_lin(_norm(x, ln2_w, ln2_b, eps), cwq, cbq) * scale, B, heads)
    x = x + _lin(_merge(F.scaled_dot_product_attention(q, cross_k, cross_v, scale=1.0)), cwo, cbo).view(shape)
    h = F.gelu(_lin(_norm(x, ln3_w, ln3_b, eps), w1, b1))
    return x + _lin(h, w2, b2).view(shape)


def int8_layer_step(
    x: Tensor,  # [B, T, d] at positions start … start+T-1
    ln1_w: Tensor,
    ln1_b: Tensor,
    qkv: torch.classes.quantized.LinearPackedParamsBase,  # fused [W_q; W_k; W_v]: d -> 3d
    qkv_b: Optional[Tensor],  # noqa: UP045  every *_b: the bias of a per-row product, else None
    out: torch.classes.quantized.LinearPackedParamsBase,
    out_b: Optional[Tensor],  # noqa: UP045
    ln2_w: Tensor,
    ln2_b: Tensor,
    cross_q: torch.classes.quantized.LinearPackedParamsBase,
    cross_q_b: Optional[Tensor],  # noqa: UP045
    cross_out: torch.classes.quantized.LinearPackedParamsBase,
    cross_out_b: Optional[Tensor],  # noqa: UP045
    ln3_w: Tensor,
    ln3_b: Tensor,
    fc1: torch.classes.quantized.LinearPackedParamsBase,
    fc1_b: Optional[Tensor],  # noqa: UP045
    fc2: torch.classes.quantized.LinearPackedParamsBase,
    fc2_b: Optional[Tensor],  # noqa: UP045
    per_row: bool,  # activations quantised per row (an int8 target) or per call (a draft)
    rows: int,  # an int8 target: `fixed_attend`'s least query rows per product (0: plain attention)
    K: Tensor,  # [B, H, 448, dh] self-attention cache
    V: Tensor,
    cross_k: Tensor,  # [B, H, S, dh]; rows > 0: Kᵀ [B, H, dh, S] (`DecoderLayer.cross_kv`)
    cross_v: Tensor,
    mask: Optional[Tensor],  # noqa: UP045  [T, start+T] or [B, 1, T, start+T] bool; None: T == 1
    # (an int8 target: `fixed_mask`, [B or 1, 1, T, N])
    start: int,
    write: Optional[Tensor],  # noqa: UP045  ragged rows: cache positions [B, H, T, dh]
    heads: int,
    eps: float,
) -> Tensor:
    """x [B, T, d] -> [B, T, d], with fbgemm's dynamic int8 products."""
    B, shape = x.shape[0], x.shape
    scale = float(x.shape[2] // heads) ** -0.5
    q, k, v = int8_product(_norm(x, ln1_w, ln1_b, eps), qkv, qkv_b, per_row).chunk(3, dim=1)  # [B·T, d] each
    q, k, v = _heads(q, B, heads) * scale, _heads(k, B, heads), _heads(v, B, heads)
    if rows > 0:  # an int8 target: every row alike whatever shares the pass (`fixed_attend`)
        assert mask is not None  # `fixed_mask`
        y = fixed_self_attend(q, k, v, K, V, mask, start, write, rows)
    else:
        y = _self_attend(q, k, v, K, V, mask, start, write)
    x = x + int8_product(y, out, out_b, per_row).view(shape)
    q = _heads(int8_product(_norm(x, ln2_w, ln2_b, eps), cross_q, cross_q_b, per_row) * scale, B, heads)
    if rows > 0:
        y = _merge(fixed_attend(q, cross_k, cross_v, None, rows, 0, True))  # cross_k: Kᵀ
    else:  # a draft's cross K/V may be bf16 (`DistilledDraft.cross_dtype`): q meets them there
        y = _merge(
            F.scaled_dot_product_attention(q.to(cross_k.dtype), cross_k, cross_v, scale=1.0).to(x.dtype)
        )
    x = x + int8_product(y, cross_out, cross_out_b, per_row).view(shape)
    h = F.gelu(int8_product(_norm(x, ln3_w, ln3_b, eps), fc1, fc1_b, per_row))
    return x + int8_product(h, fc2, fc2_b, per_row).view(shape)


SCRIPT_CACHE = 1  # bump to drop every cached compilation


def _cached_path(kind: str) -> Path:
    """Where `scripted(kind)`'s compilation is cached: keyed by this file's source, the
    torch version and the kind, so an edit or an upgrade compiles afresh."""
    h = hashlib.sha256(f"{SCRIPT_CACHE}\0{torch.__version__}\0{kind}\0".encode())
    h.update(Path(__file__).read_bytes())
    return default_cache_root() / "scripted" / f"{kind}-{h.hexdigest()[:32]}.pt"


@functools.cache
def scripted(kind: str):
    """torch.jit.script of `int8_layer_step` ("int8") or `fp32_layer_step` ("fp32"), or None
    where this PyTorch cannot script it.

    Compiling parses this file's source and builds the graphs in every fresh process; the
    compilation is cached instead (`_cached_path`) and loading it is quicker (measured:
    docs/benchmarks.md). A loaded one is the saved graph's `forward` (a ScriptMethod, the
    same graph as the function it was saved from: tested bitwise). A cache that cannot be
    read or written only means compiling."""
    fn = {"int8": int8_layer_step, "fp32": fp32_layer_step}[kind]
    path = _cached_path(kind)
    if path.is_file():
        try:
            return torch.jit.load(str(path), map_location="cpu").forward
        except Exception:  # noqa: BLE001 (a truncated or foreign file: compile instead)
            pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # known: see the module docstring
            compiled = torch.jit.script(fn)
    except Exception:  # noqa: BLE001 (any scripting failure means: stay eager)
        return None
    try:
        store(path, compiled.save_to_buffer())
    except (OSError, RuntimeError):  # read-only cache: compiled again next time
        pass
    return compiled


def int8_args(layer, fixed_rows: int = 0) -> tuple:
    """A quantized `layers.DecoderLayer`'s tensors and packed products (`linear.Int8Linear`),
    in `int8_layer_step` order. fixed_rows: an int8 target's row-invariant attention (0: plain)."""
    a, c = layer.self_attn, layer.encoder_attn
    q8 = (a.qkv_proj, a.out_proj, c.q_proj, c.out_proj, layer.fc1, layer.fc2)
    (qkv, qkv_b), (out, out_b), (cq, cq_b), (co, co_b), (f1, f1_b), (f2, f2_b) = (
        (m.packed, m.bias) for m in q8
    )
    return (
        layer.self_attn_layer_norm.weight,
        layer.self_attn_layer_norm.bias,
        qkv,
        qkv_b,
        out,
        out_b,
        layer.encoder_attn_layer_norm.weight,
        layer.encoder_attn_layer_norm.bias,
        cq,
        cq_b,
        co,
        co_b,
        layer.final_layer_norm.weight,
        layer.final_layer_norm.bias,
        f1,
        f1_b,
        f2,
        f2_b,
        layer.fc1.per_row,
        fixed_rows,
    )


def fp32_args(layer, few: bool = False) -> tuple:
    """A `LeanDecoder` layer's norms and product weights (`PackedLinear` or `TransposedLinear`
    `step_weight`) and biases, in `fp32_layer_step` order. few: each product's form for few
    rows instead (`PackedLinear.few`, fp16-packed); () when a product has none."""
    a, c = layer.self_attn, layer.encoder_attn
    prods = [a.q_proj, a.k_proj, a.v_proj, a.out_proj, c.q_proj, c.out_proj, layer.fc1, layer.fc2]
    if few:
        prods = [getattr(p, "few", None) for p in prods]
        if any(p is None for p in prods):
            return ()
    q, k, v, o, cq, co, f1, f2 = ((p.step_weight, p.bias) for p in prods)
    norm = (layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm)
    (n1w, n1b), (n2w, n2b), (n3w, n3b) = ((n.weight, n.bias) for n in norm)
    return (n1w, n1b, *q, *k, *v, *o, n2w, n2b, *cq, *co, n3w, n3b, *f1, *f2)


class ScriptedStep:
    """A layer's cached passes as one scripted function (`fp32_layer_step` or
    `int8_layer_step`): passes of up to `max_rows` rows (B·T) run `fn` with the layer's weight
    arguments `args` (or, up to `few_rows` rows, `few`, fbgemm's fp16-packed forms); others,
    and passes without a cache, run the reference layer itself. One of the layer forms
    `specasr.runtime.forms` chooses at load; the layer is not changed."""

    def __init__(
        self, layer, fn, args: tuple, max_rows: float, few: tuple = (), few_rows: int = 0, fixed_rows: int = 0
    ) -> None:
        self.layer, self.fn, self.args, self.max_rows = layer, fn, args, max_rows
        self.few, self.few_rows = few, few_rows if few else 0
        self.fixed_rows = fixed_rows  # passed to the reference layer for passes above max_rows
        self.heads, self.eps = layer.heads, layer.self_attn_layer_norm.eps

    def __call__(
        self,
        x: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        mask: Tensor | None,
        cache,
        start: int,
        write: Tensor | None,
    ) -> Tensor:
        """x [B, T, d] -> [B, T, d], as `DecoderLayer.forward` with these arguments."""
        rows = x.shape[0] * x.shape[1]
        if cache is None or rows > self.max_rows:
            return self.layer(x, cross_k, cross_v, mask, cache, start, write, self.fixed_rows)
        weights = self.few if rows <= self.few_rows else self.args
        return self.fn(x, *weights, *cache, cross_k, cross_v, mask, start, write, self.heads, self.eps)
