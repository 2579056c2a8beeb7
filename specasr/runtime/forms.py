"""How a decoder's layers run: one reference layer, explicit faster forms, chosen once.

`specasr.runtime.layers.DecoderLayer.forward` is the reference. A *layer step* is anything
that runs one layer's cached pass with the reference's arguments:

    step(x [B, T, d], cross_k, cross_v, mask, cache (K, V), start, write) -> [B, T, d]

The forms:

- `eager`: the reference layer itself (`EagerStep`); any device, any dtype.
- `scripted-fp32`: a CPU fp32 layer as one TorchScript function over packed products
  (`specasr.backends.cpu.scripted.fp32_layer_step`) for passes of up to `MANY_ROWS` rows;
  fbgemm's fp16-packed copies for passes of up to `FEW_ROWS` rows where the load made them.
- `scripted-int8`: an int8 layer (fbgemm, per-row scales) as one TorchScript function
  (`int8_layer_step`) at any row count.
- `fixed_rows` > 0 (an int8 target): attention runs row-invariantly
  (`specasr.backends.cpu.scripted.fixed_attend`), so a verify pass scores each token
  bitwise as a one-token step does; the count comes from a probe of this machine's BLAS
  (`specasr.backends.cpu.invariant`).

Beside the layer forms, two whole-pass forms exist: an int8 draft's one-token step as one C
call (`specasr.backends.cpu.fused`, held by the draft since it reads the draft's int8 rows),
and the fixed-shape pass of the device loop (`specasr.decode.graphed.fixed_pass`), which
runs the same layer steps over all 448 cache positions so that its shapes can be captured.

`choose` picks a form from what the load made of the weights (device, dtype, product forms)
and this machine's features; `specasr.models.loading.load_pair` calls it once per model and
keeps the result on the `ModelPair`; runners are built with it. Layers are never changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from specasr.backends.cpu.linear import FEW_ROWS, MANY_ROWS, Int8Linear
from specasr.backends.cpu.scripted import ScriptedStep, fp32_args, int8_args, scripted

EAGER, SCRIPTED_FP32, SCRIPTED_INT8 = "eager", "scripted-fp32", "scripted-int8"


class LayerStep(Protocol):
    """One decoder layer's pass, as `DecoderLayer.forward` with a cache."""

    def __call__(
        self,
        x: Tensor,  # [B, T, d]
        cross_k: Tensor,  # [B, H, S, dh] (fixed_rows: Kᵀ [B, H, dh, S])
        cross_v: Tensor,  # [B, H, S, dh]
        mask: Tensor | None,
        cache: tuple[Tensor, Tensor] | None,  # K, V [B, H, 448, dh]
        start: int,
        write: Tensor | None,  # ragged rows: [B, H, T, dh] scatter index
    ) -> Tensor: ...


class EagerStep:
    """The reference layer, run as it is."""

    def __init__(self, layer, fixed_rows: int = 0) -> None:
        self.layer, self.fixed_rows = layer, fixed_rows

    def __call__(self, x, cross_k, cross_v, mask, cache, start, write) -> Tensor:
        return self.layer(x, cross_k, cross_v, mask, cache, start, write, self.fixed_rows)


@dataclass(frozen=True)
class LayerForm:
    """How one decoder's layers run cached passes (the module docstring lists the forms)."""

    name: str  # EAGER, SCRIPTED_FP32 or SCRIPTED_INT8
    why: str  # one line: what in the weights or the machine chose it
    fixed_rows: int = 0  # > 0: row-invariant attention with at least this many query rows

    def steps(self, layers) -> tuple[LayerStep, ...]:
        """One step per layer of `layers` (`DecoderLayer`s in the weight forms this form needs)."""
        if self.name == EAGER:
            return tuple(EagerStep(layer, self.fixed_rows) for layer in layers)
        if self.name == SCRIPTED_INT8:
            fn = scripted("int8")
            return tuple(
                ScriptedStep(
                    layer, fn, int8_args(layer, self.fixed_rows), math.inf, fixed_rows=self.fixed_rows
                )
                for layer in layers
            )
        fn = scripted("fp32")
        return tuple(
            ScriptedStep(layer, fn, fp32_args(layer), MANY_ROWS, fp32_args(layer, few=True), FEW_ROWS)
            for layer in layers
        )

    def describe(self) -> str:
        extra = f", row-invariant attention from {self.fixed_rows} query rows" if self.fixed_rows else ""
        return f"{self.name}{extra}: {self.why}"


def _int8(layers) -> bool:
    return bool(layers) and isinstance(layers[0].fc1, Int8Linear)


def choose(layers, script: bool = True, lean: bool = False) -> LayerForm:
    """The form for a decoder's `layers` as loaded. lean: the layers are a CPU fp32 view
    whose products are all packed or Wᵀ forms (`LeanDecoder`), which the fp32 script takes.
    script False: the reference layers (what the tests compare every form against)."""
    if not layers:
        return LayerForm(EAGER, "no layers")
    weight = layers[0].self_attn_layer_norm.weight
    if weight.device.type != "cpu":
        return LayerForm(EAGER, f"the reference layer on {weight.device.type}")
    if _int8(layers):
        rows = 0
        if layers[0].fc1.per_row:  # a target (per-row activations): exact speculation needs it
            from specasr.backends.cpu.invariant import fixed_rows

            rows = fixed_rows()
        if script and scripted("int8") is not None:
            why = "int8 products (fbgemm) as one TorchScript function per layer"
            return LayerForm(SCRIPTED_INT8, why, rows)
        return LayerForm(EAGER, "int8 products; TorchScript off or unavailable", rows)
    if lean and script and scripted("fp32") is not None:
        return LayerForm(SCRIPTED_FP32, "CPU fp32: packed products as one TorchScript function per layer")
    if lean:
        return LayerForm(EAGER, "CPU fp32 packed products; TorchScript off or unavailable")
    return LayerForm(EAGER, f"the reference layer ({weight.dtype} on cpu)")
