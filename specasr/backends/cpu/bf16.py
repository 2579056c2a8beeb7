"""bf16 products for the once-per-window work, on CPUs that compute bf16 dot products natively.

`--compute-type bfloat16` / `int8_bfloat16` (as faster-whisper names its types): the
encoder's matrices, and the decoder's cross-attention K/V projections (which also run once
per window, over its 1500 frames), are held in bf16, and their products take bf16 inputs
with fp32 accumulation (oneDNN: AVX512_BF16 or AMX). The per-token products (the decoder's
other matrices and the head) keep their own type, fp32 or int8. The residual stream, the
layer norms' arithmetic, the biases and attention stay fp32. With native bf16 an encoder
product takes about half its fp32 time (measured: docs/benchmarks.md). Lossy: the
encoder states move by bf16's rounding (8 significant bits), so this is a model of its own,
like an int8 target; speculative decoding stays exact against it, since the target and the
draft read the same states and the same cross K/V. Where the instructions are missing,
oneDNN emulates bf16 slower than fp32, so the loader refuses the type there (`available`).

Within a layer: the norms hand the products bf16 rows (`Bf16Norm`), fc1's output stays bf16
through GELU into fc2, and every product that feeds the fp32 stream adds its fp32 bias while
leaving bf16 (`Bf16Linear`, one pass).
"""

from __future__ import annotations

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


def bf16_encoder(encoder: nn.Module) -> nn.Module:
    """Makes a `specasr.models.whisper.WhisperEncoder`'s layers compute their products in
    bf16, in place: q, k, v, out and fc2 return fp32 (the stream they feed), fc1 returns bf16
    for GELU and fc2. The convolutions, positions and final norm stay fp32."""
    for layer in encoder.layers:
        if isinstance(layer.fc1, Bf16Linear):
            continue
        a = layer.self_attn
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(a, name, Bf16Linear.of(getattr(a, name)))
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
