"""The Triton import and the device helpers the Triton kernels share.

Imported only by `exact_triton`, which `verify` loads on first use on CUDA tensors (or under
TRITON_INTERPRET=1), so CPU runs never import Triton.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton ships for Linux x86_64 only; the torch paths work without it

    class _NoTriton:
        constexpr = None

        @staticmethod
        def jit(fn):
            return fn

    triton = tl = _NoTriton()


@triton.jit
def _scaled(x, temperature):
    """Logits → fp32 logits / T with IEEE division, as torch computes them."""
    return tl.math.div_rn(x.to(tl.float32), temperature)


@triton.jit
def _sigmoid_prob(z, alpha, beta):
    """p̂ = σ((clamp(z, α, β) − α) / (β − α)); suppressed tokens (z = −inf) get p̂ = 0."""
    u = tl.math.div_rn(tl.minimum(tl.maximum(z, alpha), beta) - alpha, beta - alpha)
    return tl.where(z == -float("inf"), 0.0, tl.math.div_rn(1.0, 1.0 + tl.exp(-u)))


@triton.jit
def _arrive(counter_ptr, expected):
    """Last-block election: True in exactly one program, after the others' stores are visible."""
    tl.debug_barrier()
    done = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    return done == expected - 1
