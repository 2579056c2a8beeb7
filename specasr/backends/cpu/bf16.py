"""bf16 products for the once-per-window work, on CPUs that compute bf16 dot products natively.

`--compute-type bfloat16` / `int8_bfloat16` (as faster-whisper names its types): the
encoder's matrices, and the decoder's cross-attention K/V projections (which also run once
per window, over its 1500 frames), are held in bf16, and their products take bf16 inputs
with fp32 accumulation (oneDNN: AVX512_BF16 or AMX). The per-token products (the decoder's
other matrices and the head) keep their own type, fp32 or int8. The residual stream, the
layer norms' arithmetic and the biases stay fp32. The encoder's self-attention is bf16 too
where the compiled library has its kernel (`Bf16Attention`: AVX512_BF16), else fp32; the
decoder's attention stays fp32. With native bf16 an encoder product takes about half its
fp32 time, and the kernel's attention a third of torch's fp32 one (measured:
docs/benchmarks.md). Lossy: the
encoder states move by bf16's rounding (8 significant bits), so this is a model of its own,
like an int8 target; speculative decoding stays exact against it, since the target and the
draft read the same states and the same cross K/V. Where the instructions are missing,
oneDNN emulates bf16 slower than fp32, so the loader refuses the type there (`available`).

Within a layer: the norms hand the products bf16 rows (`Bf16Norm`), fc1's output stays bf16
through GELU into fc2, and every product that feeds the fp32 stream adds its fp32 bias while
leaving bf16 (`Bf16Linear`, one pass).
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import Tensor, nn

BF16 = torch.bfloat16


def available() -> bool:
    """Whether this CPU computes bf16 dot products natively (AVX512_BF16 or AMX tiles)."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's, where this torch has them
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


class Bf16Linear(nn.Module):
    """y = x Wᵀ + b with W in bf16: x [..., in] (fp32 or bf16) -> [..., out] in `out`
    (fp32: the bias, fp32, is added as the product leaves bf16; bf16: stays bf16)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, out: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().float().to(BF16), requires_grad=False)  # [out, in]
        keep = torch.float32 if out == torch.float32 else BF16
        bias = None if bias is None else bias.detach().float().to(keep)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.out = out

    @classmethod
    def of(cls, linear: nn.Module, out: torch.dtype = torch.float32) -> Bf16Linear:
        """The bf16 form of a Linear (or `MappedLinear`): its weight rounded to bf16."""
        return cls(linear.weight, linear.bias, out)

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(BF16)  # no copy when x is bf16 already
        if self.out == BF16:
            return F.linear(x, self.weight, self.bias)
        y = F.linear(x, self.weight)  # [..., out] bf16
        return torch.add(y, self.bias) if self.bias is not None else y.float()  # fp32, one pass


class Bf16Norm(nn.Module):
    """A LayerNorm computed in fp32 whose output rows are bf16 (the products' input)."""

    def __init__(self, norm: nn.LayerNorm) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x).to(BF16)


class Bf16Attention(nn.Module):
    """An encoder layer's self-attention (`specasr.models.whisper.SelfAttention`'s interface)
    as one call into the compiled library (`fused.library`, `attend_bf16` in draft_step.cpp):
    q, k, v [B, S, H·64] bf16, q scaled -> [B, S, H·64] fp32, the heads merged. Both products
    are bf16 dot products summed in fp32, the softmax fp32. A window's output does not depend
    on the other windows of the batch."""

    def __init__(self, heads: int, lib) -> None:
        super().__init__()
        self.heads, self.lib = heads, lib

    @classmethod
    def of(cls, heads: int, d: int) -> Bf16Attention | None:
        """The library's attention for `heads` heads of d / heads = 64 (every Whisper's), or None
        where it cannot run: the library off or unbuilt, or built for a CPU without AVX512_BF16."""
        from specasr.backends.cpu import fused

        if d != 64 * heads or not fused.enabled():
            return None
        lib = fused.library()
        return cls(heads, lib) if lib is not None and lib.attend_bf16_built() == 1 else None

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q, k, v = (t.to(BF16).contiguous() for t in (q, k, v))  # [B, S, d] each
        B, S, d = q.shape
        out = torch.empty(B, S, d)  # [B, S, d] fp32
        ptr = ctypes.c_void_p
        code = self.lib.attend_bf16(
            ptr(q.data_ptr()), ptr(k.data_ptr()), ptr(v.data_ptr()), ptr(out.data_ptr()),
            B, S, self.heads, d // self.heads, torch.get_num_threads(),
        )  # fmt: skip
        if code:
            raise RuntimeError(f"attend_bf16 refused [{B}, {S}, {d}] with {self.heads} heads (code {code})")
        return out


def bf16_encoder(encoder: nn.Module) -> nn.Module:
    """Makes a `specasr.models.whisper.WhisperEncoder`'s layers compute their products in
    bf16, in place: out and fc2 return fp32 (the stream they feed), fc1 returns bf16 for GELU
    and fc2; q, k and v return bf16 into `Bf16Attention` where it runs, else fp32 into the
    layer's own attention. The convolutions, positions and final norm stay fp32."""
    for layer in encoder.layers:
        if isinstance(layer.fc1, Bf16Linear):
            continue
        a = layer.self_attn
        attention = Bf16Attention.of(layer.heads, layer.heads * layer.dh)
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(a, name, Bf16Linear.of(getattr(a, name), torch.float32 if attention is None else BF16))
        a.out_proj = Bf16Linear.of(a.out_proj)
        if attention is not None:
            layer.attend = attention
        layer.fc1, layer.fc2 = Bf16Linear.of(layer.fc1, BF16), Bf16Linear.of(layer.fc2)
        layer.self_attn_layer_norm = Bf16Norm(layer.self_attn_layer_norm)
        layer.final_layer_norm = Bf16Norm(layer.final_layer_norm)
    return encoder


def bf16_cross_kv(decoder: nn.Module) -> nn.Module:
    """Makes a Whisper decoder's cross-attention K/V projections bf16 products with fp32
    outputs, in place: they run once per window over its 1500 frames, as the encoder does
    (the window's set-up, a large share of it in fp32: docs/benchmarks.md). Every step then
    reads the same fp32 K/V, so a target's passes stay row-invariant (`specasr.backends.cpu.invariant`)."""
    for layer in decoder.layers:
        a = layer.encoder_attn
        for name in ("k_proj", "v_proj"):
            if not isinstance(getattr(a, name), Bf16Linear):
                setattr(a, name, Bf16Linear.of(getattr(a, name)))
    return decoder
