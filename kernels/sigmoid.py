"""The `sigmoid` verifier: the approximation of Wagner et al., "Optimized Speculative
Sampling for GPU Hardware Accelerators", as a torch path and a Triton kernel.

With z = logits / T and scale (α, β) (default (−10³, 10³), the paper's ASR setting):

    p̂(v) = σ((clamp(z_v, α, β) − α) / (β − α)),      σ(u) = 1 / (1 + e^(−u)),

and q̂ likewise from the draft logits. p̂ and q̂ replace p and q elementwise, with no softmax:
accept d_i while r_i <= p̂_i(d_i) / q̂_i(d_i); at the first rejection n draw the token by the
exponential race from the un-normalised residual max(0, p̂_n − q̂_n) (from p̂_n if that is
identically zero), or from p̂_G when every draft is accepted. One deliberate deviation from the
authors' code: a suppressed token (z = −inf) gets p̂ = 0 instead of σ(0) = 1/2, so filtered
tokens can never be emitted. At T = 0 the mode is argmax matching, like every mode.

It is lossy by construction. The scaled argument (z − α)/(β − α) lies in [0.49, 0.515] for
Whisper's logit range (about −20..+30), so p̂ ≈ q̂ ≈ 0.62 for every token: the ratio test
accepts almost everything and the bonus/residual draws are nearly uniform over the vocabulary
(see docs/kernels.md and `bench.acceptance_study`).

Triton: `exact_triton._residual_kernel` specialised with SIGMOID=True, one launch per call (no
log-sum-exp pass is needed): it gathers p̂, q̂ at the drafted tokens, finds n, and races over
row n with the same last-block reduction as the exact kernels.
"""

from __future__ import annotations

import torch

from .reference import accepted_count, greedy, noise_at, sample_residual

DEFAULT_SCALE = (-1e3, 1e3)


def sigmoid_prob(z: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """p̂ = σ((clamp(z, α, β) − α) / (β − α)) elementwise, 0 where z = −inf; z: fp32 logits / T."""
    u = (z.clamp(alpha, beta) - alpha) / (beta - alpha)
    return (1.0 / (1.0 + torch.exp(-u))).masked_fill_(torch.isneginf(z), 0.0)


def sigmoid_torch(
    target_logits: torch.Tensor,  # [B, G+1, V]
    draft_logits: torch.Tensor,  # [B, G, V]
    draft_tokens: torch.Tensor,  # [B, G] int64
    uniforms: torch.Tensor,  # [B, G]
    noise: torch.Tensor,  # [B, V] or [B, G+1, V]
    *,
    temperature: float,
    sigmoid_scale: tuple[float, float] = DEFAULT_SCALE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch path and reference of the sigmoid kernel: (n_accepted [B], next_token [B])."""
    if temperature == 0:
        return greedy(target_logits, draft_tokens)
    alpha, beta = sigmoid_scale
    B, G = draft_tokens.shape
    tok = draft_tokens.unsqueeze(-1)  # [B, G, 1]
    t_tok = target_logits[:, :G].gather(-1, tok).squeeze(-1).float() / temperature  # [B, G]
    s_tok = draft_logits.gather(-1, tok).squeeze(-1).float() / temperature  # [B, G]
    ratio = sigmoid_prob(t_tok, alpha, beta) / sigmoid_prob(s_tok, alpha, beta)
    n = accepted_count(uniforms <= ratio)  # [B]
    rows = torch.arange(B, device=target_logits.device)
    p_n = sigmoid_prob(target_logits[rows, n].float() / temperature, alpha, beta)  # [B, V]
    s_n = draft_logits[rows, n.clamp(max=G - 1)].float() / temperature  # [B, V]
    q_n = sigmoid_prob(s_n, alpha, beta) * (n < G).float()[:, None]  # q̂_G := 0
    return n, sample_residual(p_n, q_n, noise_at(noise, n))


def sigmoid_triton(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    uniforms: torch.Tensor,
    noise: torch.Tensor,
    *,
    temperature: float,
    sigmoid_scale: tuple[float, float] = DEFAULT_SCALE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sigmoid Triton kernel (one launch); same arguments and results as `sigmoid_torch`."""
    from . import exact_triton  # imports Triton (CUDA, or TRITON_INTERPRET=1)

    return exact_triton.launch(
        target_logits, draft_logits, draft_tokens, uniforms, noise,
        temperature=temperature, sigmoid_scale=tuple(map(float, sigmoid_scale)),
    )  # fmt: skip
