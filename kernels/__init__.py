"""Speculative-decoding verifiers: `verify` dispatches over mode × backend.

    n_accepted, next_token = verify(target_logits, draft_logits, draft_tokens, uniforms, noise,
                                    temperature=T, mode="exact")

Modes: `baseline` (unfused torch reference, `reference.baseline`), `exact` (fused; identical
tokens to baseline), `sigmoid` (the lossy approximation of Wagner et al.). Backends: `torch`,
`triton` (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1), and `auto` = triton on CUDA
tensors when Triton is installed, torch otherwise. `baseline` always runs in torch. Nothing in
`verify` synchronises with the device: the results stay where the inputs are.
"""

from __future__ import annotations

import torch

from specasr.constants import BACKENDS
from specasr.constants import VERIFY_MODES as MODES

from . import exact_torch, sigmoid
from ._common import HAS_TRITON, check_inputs, first_argmax
from .reference import baseline, greedy, make_randomness
from .sigmoid import DEFAULT_SCALE

__all__ = ["MODES", "BACKENDS", "verify", "make_randomness", "baseline"]


def _use_triton(backend: str, device: torch.device) -> bool:
    if backend == "auto":
        return HAS_TRITON and device.type == "cuda"
    return backend == "triton"


def verify(
    target_logits: torch.Tensor,  # [B, γ+1, V] filtered logits, not divided by T
    draft_logits: torch.Tensor,  # [B, γ, V] same dtype; −inf outside a reduced draft vocabulary
    draft_tokens: torch.Tensor,  # [B, γ] int64
    uniforms: torch.Tensor,  # [B, γ] float32 in [0, 1): the ratio tests' r
    noise: torch.Tensor,  # [B, V] (or [B, γ+1, V]) float32 Exp(1): the final token's race
    *,
    temperature: float,
    mode: str,
    sigmoid_scale: tuple[float, float] = DEFAULT_SCALE,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a prefix of the drafts and draw one more token: (n_accepted [B], next_token [B]).

    Both int64 on the inputs' device. The maths and its edge cases are in `reference`;
    sigmoid's formula is in `sigmoid`; the exact design is in `exact_torch`, the kernels and
    their bytes moved in `exact_triton`.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if mode == "sigmoid" and not sigmoid_scale[0] < sigmoid_scale[1]:
        raise ValueError(f"sigmoid_scale needs α < β, got {sigmoid_scale}")
    check_inputs(target_logits, draft_logits, draft_tokens, uniforms, noise)
    args = (target_logits, draft_logits, draft_tokens, uniforms, noise)
    if mode == "baseline":
        return baseline(*args, temperature=temperature)
    if _use_triton(backend, target_logits.device):
        if mode == "sigmoid":
            return sigmoid.sigmoid_triton(*args, temperature=temperature, sigmoid_scale=sigmoid_scale)
        from . import exact_triton  # imports Triton: only on this path, never on a CPU run

        return exact_triton.launch(*args, temperature=temperature)
    if temperature == 0:
        return greedy(target_logits, draft_tokens, argmax=first_argmax)
    if mode == "sigmoid":
        return sigmoid.sigmoid_torch(*args, temperature=temperature, sigmoid_scale=sigmoid_scale)
    return exact_torch.exact_torch(*args, temperature=temperature)
