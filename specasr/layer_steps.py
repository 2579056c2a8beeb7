"""Decoder layers over a few new tokens, as TorchScript functions (CPU).

A decoder pass on CPU over 1–9 tokens is dozens of small products and views per layer, and
the Python around each op (module calls, views, reshapes) costs about as much as a small
product. Each function here is `draft.DraftLayer.forward` for one kind of layer, written
as one scripted function, so the interpreter runs the ops without Python between them:

- `int8_layer_step`: a distilled draft's layer after `DistilledDraft.quantize_int8`
  (fbgemm int8 products). Same ops, same order: bitwise the eager layer (tested). Base's
  draft, 2-core dev box: 3.5 → 2.3 ms per one-token step.
- `fp32_layer_step`: a `lean_decoder.LeanDecoder` layer (the target on CPU), for passes of
  up to `cpu_linear.MANY_ROWS` rows, where its products are x·Wᵀ with a contiguous Wᵀ. It
  agrees with the eager layer to about 1e-6 (tested): the target stays the target, as
  with the product forms of `cpu_linear`. Base, one token: 17.0 → 14.3 ms per pass.

Both write this block's keys and values into the preallocated cache at `start` and attend
over positions 0 … start+T-1, like the eager layer. TorchScript is deprecated in recent
PyTorch: where scripting fails or is gone, `scripted` returns None and the layers stay
eager.
"""

from __future__ import annotations

import functools
import warnings
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor


def _lin(x: Tensor, wt: Tensor, b: Optional[Tensor]) -> Tensor:  # noqa: UP045 (TorchScript)
    """x [rows, in] · Wᵀ [in, out] (+ b) -> [rows, out], as `cpu_linear.TransposedLinear`."""
    if b is None:
        return x @ wt
    return torch.addmm(b, x, wt)


def fp32_layer_step(
    x: Tensor,  # [B, T, d] at positions start … start+T-1, B·T ≤ MANY_ROWS
    ln1_w: Tensor,
    ln1_b: Tensor,
    wq: Tensor,  # every w: Wᵀ [in, out], contiguous; every b: [out] or None
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
    mask: Optional[Tensor],  # noqa: UP045  [T, start+T] bool, or None when T == 1
    start: int,
    heads: int,
    eps: float,
) -> Tensor:
    """x [B, T, d] -> [B, T, d]: pre-norm self-attention, cross-attention and GELU MLP."""
    B, T, d = x.shape[0], x.shape[1], x.shape[2]
    dh = d // heads
    scale = float(dh) ** -0.5
    h = F.layer_norm(x, [d], ln1_w, ln1_b, eps).reshape(B * T, d)
    q = (_lin(h, wq, bq) * scale).view(B, T, heads, dh).transpose(1, 2)  # [B, H, T, dh]
    K[:, :, start : start + T] = _lin(h, wk, bk).view(B, T, heads, dh).transpose(1, 2)
    V[:, :, start : start + T] = _lin(h, wv, bv).view(B, T, heads, dh).transpose(1, 2)
    k, v = K[:, :, : start + T], V[:, :, : start + T]
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)  # [B, H, T, dh]
    x = x + _lin(y.transpose(1, 2).reshape(B * T, d), wo, bo).view(B, T, d)
    h = F.layer_norm(x, [d], ln2_w, ln2_b, eps).reshape(B * T, d)
    q = (_lin(h, cwq, cbq) * scale).view(B, T, heads, dh).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, cross_k, cross_v, scale=1.0)
    x = x + _lin(y.transpose(1, 2).reshape(B * T, d), cwo, cbo).view(B, T, d)
    h = F.layer_norm(x, [d], ln3_w, ln3_b, eps).reshape(B * T, d)
    h = F.gelu(_lin(h, w1, b1))
    return x + _lin(h, w2, b2).view(B, T, d)


def int8_layer_step(
    x: Tensor,  # [B, T, d] at positions start … start+T-1
    ln1_w: Tensor,
    ln1_b: Tensor,
    qkv: torch.classes.quantized.LinearPackedParamsBase,  # fused [W_q; W_k; W_v]: d -> 3d
    out: torch.classes.quantized.LinearPackedParamsBase,
    ln2_w: Tensor,
    ln2_b: Tensor,
    cross_q: torch.classes.quantized.LinearPackedParamsBase,
    cross_out: torch.classes.quantized.LinearPackedParamsBase,
    ln3_w: Tensor,
    ln3_b: Tensor,
    fc1: torch.classes.quantized.LinearPackedParamsBase,
    fc2: torch.classes.quantized.LinearPackedParamsBase,
    K: Tensor,  # [B, H, 448, dh] self-attention cache
    V: Tensor,
    cross_k: Tensor,  # [B, H, S, dh]
    cross_v: Tensor,
    mask: Optional[Tensor],  # noqa: UP045  [T, start+T] bool, or None when T == 1
    start: int,
    heads: int,
    eps: float,
) -> Tensor:
    """x [B, T, d] -> [B, T, d], with fbgemm's dynamic int8 products (x quantised per call)."""
    B, T, d = x.shape[0], x.shape[1], x.shape[2]
    dh = d // heads
    scale = float(dh) ** -0.5
    h = F.layer_norm(x, [d], ln1_w, ln1_b, eps).reshape(B * T, d)
    qkv_ = torch.ops.quantized.linear_dynamic(h, qkv, True).view(B, T, 3, heads, dh)
    q = qkv_[:, :, 0].transpose(1, 2) * scale  # [B, H, T, dh]
    K[:, :, start : start + T] = qkv_[:, :, 1].transpose(1, 2)
    V[:, :, start : start + T] = qkv_[:, :, 2].transpose(1, 2)
    k, v = K[:, :, : start + T], V[:, :, : start + T]
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
    y = y.transpose(1, 2).reshape(B * T, d)
    x = x + torch.ops.quantized.linear_dynamic(y, out, True).view(B, T, d)
    h = F.layer_norm(x, [d], ln2_w, ln2_b, eps).reshape(B * T, d)
    q = (torch.ops.quantized.linear_dynamic(h, cross_q, True) * scale).view(B, T, heads, dh).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, cross_k, cross_v, scale=1.0).transpose(1, 2).reshape(B * T, d)
    x = x + torch.ops.quantized.linear_dynamic(y, cross_out, True).view(B, T, d)
    h = F.layer_norm(x, [d], ln3_w, ln3_b, eps).reshape(B * T, d)
    h = F.gelu(torch.ops.quantized.linear_dynamic(h, fc1, True))
    return x + torch.ops.quantized.linear_dynamic(h, fc2, True).view(B, T, d)


@functools.cache
def scripted(kind: str):
    """torch.jit.script of `int8_layer_step` ("int8") or `fp32_layer_step` ("fp32"), or None
    where this PyTorch cannot script it."""
    fn = {"int8": int8_layer_step, "fp32": fp32_layer_step}[kind]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # known: see the module docstring
            return torch.jit.script(fn)
    except Exception:  # noqa: BLE001 (any scripting failure means: stay eager)
        return None


def int8_args(layer) -> tuple:
    """A quantized `draft.DraftLayer`'s tensors and packed products, in `int8_layer_step` order."""
    a, c = layer.self_attn, layer.encoder_attn
    return (
        layer.self_attn_layer_norm.weight,
        layer.self_attn_layer_norm.bias,
        a.qkv_proj.packed,
        a.out_proj.packed,
        layer.encoder_attn_layer_norm.weight,
        layer.encoder_attn_layer_norm.bias,
        c.q_proj.packed,
        c.out_proj.packed,
        layer.final_layer_norm.weight,
        layer.final_layer_norm.bias,
        layer.fc1.packed,
        layer.fc2.packed,
    )


def fp32_args(layer) -> tuple:
    """A `LeanDecoder` layer's norms and `TransposedLinear` Wᵀ/biases, in `fp32_layer_step` order."""
    a, c = layer.self_attn, layer.encoder_attn
    lins = (a.q_proj, a.k_proj, a.v_proj, a.out_proj)
    return (
        layer.self_attn_layer_norm.weight,
        layer.self_attn_layer_norm.bias,
        *(t for lin in lins for t in (lin.wt, lin.bias)),
        layer.encoder_attn_layer_norm.weight,
        layer.encoder_attn_layer_norm.bias,
        c.q_proj.wt,
        c.q_proj.bias,
        c.out_proj.wt,
        c.out_proj.bias,
        layer.final_layer_norm.weight,
        layer.final_layer_norm.bias,
        layer.fc1.wt,
        layer.fc1.bias,
        layer.fc2.wt,
        layer.fc2.bias,
    )
