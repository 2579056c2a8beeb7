"""Shared plumbing of the verifier backends: input checks and torch helpers (no Triton import).

Terms used throughout `specasr.kernels`:
  G        γ, the number of drafted tokens per row
  n        accepted count, the length of the accepted draft prefix (0..G)
  residual w = max(0, p_n − q_n) at the first rejected position n; at n = G, q_G := 0, so
           w = p_G and the same code draws the bonus token
  race     the exponential race argmax_v w_v / E_v with E_v ~ Exp(1) i.i.d., an exact sample
           from w / Σw that needs no normaliser; ties go to the lowest index
"""

from __future__ import annotations

import importlib.util

import numpy as np
import torch

# Whether Triton is installed, found without importing it: the import costs start-up time
# and resident memory (measured: docs/benchmarks.md), which CPU runs never need. `_triton`
# imports it, and only the CUDA (or TRITON_INTERPRET) paths import `_triton`.
HAS_TRITON = importlib.util.find_spec("triton") is not None


MAX_VOCAB = 1 << 24  # tile partials carry token indices as float32, exact below 2**24


def check_inputs(
    target_logits: torch.Tensor,  # [B, G+1, V]
    draft_logits: torch.Tensor,  # [B, G, V]
    draft_tokens: torch.Tensor,  # [B, G] int64
    uniforms: torch.Tensor,  # [B, G] float32
    noise: torch.Tensor,  # [B, V] or [B, G+1, V] float32
) -> tuple[int, int, int]:
    """Validate the verify contract's shapes and dtypes (no device sync); return (B, G, V)."""
    if target_logits.dim() != 3 or draft_logits.dim() != 3:
        raise ValueError("target_logits must be [B, G+1, V] and draft_logits [B, G, V]")
    B, G1, V = target_logits.shape
    G = G1 - 1
    if G < 1:
        raise ValueError(f"need at least one drafted token, got target_logits {tuple(target_logits.shape)}")
    if tuple(draft_logits.shape) != (B, G, V):
        raise ValueError(f"draft_logits {tuple(draft_logits.shape)} != {(B, G, V)}")
    if draft_logits.dtype != target_logits.dtype or not target_logits.is_floating_point():
        raise ValueError("target and draft logits must share one floating dtype")
    if tuple(draft_tokens.shape) != (B, G) or draft_tokens.dtype != torch.int64:
        raise ValueError(f"draft_tokens must be int64 [B, G] = {(B, G)}")
    if tuple(uniforms.shape) != (B, G):
        raise ValueError(f"uniforms must be [B, G] = {(B, G)}")
    if tuple(noise.shape) not in ((B, V), (B, G + 1, V)):
        raise ValueError(f"noise must be [B, V] or [B, G+1, V], got {tuple(noise.shape)}")
    if V > MAX_VOCAB:
        raise ValueError(f"vocabulary of {V} exceeds {MAX_VOCAB}")
    devices = {t.device for t in (target_logits, draft_logits, draft_tokens, uniforms, noise)}
    if len(devices) != 1:
        raise ValueError(f"all verify inputs must be on one device, got {devices}")
    return B, G, V


_counters: dict[torch.device, torch.Tensor] = {}


def arrival_counters(device: torch.device, B: int) -> torch.Tensor:
    """Per-row arrival counters for the kernels' last-block reductions: [>= B] int32.

    The last program of a row to arrive resets its counter to 0, so the buffer stays zeroed
    between calls and no memset launch is needed. Consequence: verify calls that share a
    device must not run concurrently on different streams.
    """
    buf = _counters.get(device)
    if buf is None or buf.numel() < B:
        buf = torch.zeros(max(B, 64), dtype=torch.int32, device=device)
        _counters[device] = buf
    return buf


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """argmax over the last dimension, first maximal index on ties: [..., V] -> [...] int64.

    On CPU it runs numpy's argmax over the tensor's memory (a view, no copy), which is several
    times cheaper than torch.argmax over a Whisper-sized row and has the same semantics: first
    maximal index, NaN counts as maximal. The CPU verifier's draw and its greedy matching run
    an argmax on every call, so this shows in the per-step time; docs/benchmarks.md ("CPU") has
    the numbers. bf16 has no numpy dtype, and other devices keep torch's.
    """
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float16) or x.requires_grad:
        return torch.argmax(x, dim=-1)
    return torch.from_numpy(np.ascontiguousarray(x.numpy().argmax(axis=-1))).long()


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())
