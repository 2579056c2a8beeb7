"""One int8 draft layer over one new token, as a TorchScript function.

A draft step on CPU is dozens of tiny products and views: an int8 product over one row
takes 60–110 µs, and the Python around each op (module calls, views, reshapes) costs about
as much again. `int8_layer_step` is `draft.DraftLayer.forward` for that one case (int8
products from `DistilledDraft.quantize_int8`, one token, a preallocated KV cache) written
as a single scripted function, so the interpreter runs the ops without Python between
them. Same ops, same order: the logits are bitwise those of the eager layer (tested).
Measured on the 2-core dev box for base's distilled draft: 3.5 → 2.3 ms per step.

TorchScript is deprecated in recent PyTorch. Where scripting fails or is gone,
`scripted_layer_step` returns None and the draft runs its eager layers.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor


def int8_layer_step(
    x: Tensor,  # [B, 1, d] at position `start`
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
    K: Tensor,  # [B, H, 448, dh] self-attention cache; this token's k is written at `start`
    V: Tensor,
    cross_k: Tensor,  # [B, H, S, dh]
    cross_v: Tensor,
    start: int,
    heads: int,
    eps: float,
) -> Tensor:
    """x [B, 1, d] -> [B, 1, d]: pre-norm self-attention, cross-attention and GELU MLP."""
    B, d = x.shape[0], x.shape[2]
    dh = d // heads
    scale = float(dh) ** -0.5
    h = F.layer_norm(x, [d], ln1_w, ln1_b, eps).view(B, d)
    qkv_ = torch.ops.quantized.linear_dynamic(h, qkv, True).view(B, 3, heads, 1, dh)
    q = qkv_[:, 0] * scale  # [B, H, 1, dh]
    K[:, :, start : start + 1] = qkv_[:, 1]
    V[:, :, start : start + 1] = qkv_[:, 2]
    y = F.scaled_dot_product_attention(q, K[:, :, : start + 1], V[:, :, : start + 1], scale=1.0)
    x = x + torch.ops.quantized.linear_dynamic(y.reshape(B, d), out, True).view(B, 1, d)
    h = F.layer_norm(x, [d], ln2_w, ln2_b, eps).view(B, d)
    q = (torch.ops.quantized.linear_dynamic(h, cross_q, True) * scale).view(B, heads, 1, dh)
    y = F.scaled_dot_product_attention(q, cross_k, cross_v, scale=1.0)  # [B, H, 1, dh]
    x = x + torch.ops.quantized.linear_dynamic(y.reshape(B, d), cross_out, True).view(B, 1, d)
    h = F.layer_norm(x, [d], ln3_w, ln3_b, eps).view(B, d)
    h = F.gelu(torch.ops.quantized.linear_dynamic(h, fc1, True))
    return x + torch.ops.quantized.linear_dynamic(h, fc2, True).view(B, 1, d)


@functools.cache
def scripted_layer_step():
    """torch.jit.script(int8_layer_step), or None where this PyTorch cannot script it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # known: see the module docstring
            return torch.jit.script(int8_layer_step)
    except Exception:  # noqa: BLE001 (any scripting failure means: stay eager)
        return None


def layer_args(layer) -> tuple:
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
