"""The torch reference verifier: `baseline`, plus the pieces every backend shares.

`baseline` is Leviathan et al. (2023), Algorithm 1, with the semantics of Hugging Face
transformers' `_speculative_sampling`, batched. It materialises p and q over the whole
vocabulary for every row, as the paper's code does; the fused backends must reproduce its
tokens. Randomness is an input (see `make_randomness`), so backends compare token for token.

Conventions shared by all modes and backends:
- logits arrive filtered (suppressed tokens are −inf) and are divided by T in fp32;
- ratio test: accept d_i while r_i <= p_i(d_i) / q_i(d_i), in IEEE arithmetic. A drafted token
  with q = 0 (impossible when drafts are sampled from q) is accepted if p > 0 (ratio +inf) and
  rejected if p = 0 (0/0 is NaN, and r <= NaN is false);
- the final token is drawn by the exponential race (`sample_residual`) from the residual
  max(0, p_n − q_n) at the first rejection n, or from p_G when all G drafts are accepted.
  When the residual is identically zero (p == q numerically) it is drawn from p_n;
- temperature 0 reduces every mode to argmax matching (`greedy`); ties go to the lowest id.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def make_randomness(
    B: int, gamma: int, V: int, generator: torch.Generator, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one verify call's randomness on the generator's device, then move it to `device`.

    Returns uniforms: [B, gamma] float32 in [0, 1), and noise: [B, V] float32 Exp(1) samples,
    clamped to the smallest normal float so that w / noise is always defined.
    """
    gen_device = generator.device
    uniforms = torch.rand(B, gamma, generator=generator, device=gen_device)
    noise = torch.empty(B, V, device=gen_device).exponential_(generator=generator)
    noise.clamp_(min=torch.finfo(torch.float32).tiny)
    return uniforms.to(device), noise.to(device)


def noise_at(noise: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """The noise row that draws the final token of each batch row: [B, V] float32.

    noise: [B, V] (one row for whichever position is sampled) or [B, G+1, V]; n: [B].
    """
    if noise.dim() == 2:
        return noise.float()
    return noise[torch.arange(noise.shape[0], device=noise.device), n].float()


def sample_residual(p_n: torch.Tensor, q_n: torch.Tensor, noise_n: torch.Tensor) -> torch.Tensor:
    """Draw the final token from max(0, p_n − q_n), or from p_n where that is ≡ 0: [B] int64.

    p_n, q_n, noise_n: [B, V] float32, with q_n = 0 on rows that draw the bonus token. The
    exponential race argmax_v(w_v / E_v), E_v ~ Exp(1) i.i.d., is an exact sample from
    w / Σw, so the normaliser is never computed. Written without boolean masks over V, which
    are slow on CPU: w + p·[max w = 0] is w, or p when w ≡ 0.
    """
    w = (p_n - q_n).clamp_min_(0.0)  # [B, V] residual
    fallback = (w.amax(dim=-1, keepdim=True) == 0).float()  # [B, 1]
    return torch.addcmul(w, p_n, fallback).div_(noise_n).argmax(dim=-1)


def _torch_argmax(x: torch.Tensor) -> torch.Tensor:
    return torch.argmax(x, dim=-1)


def greedy(
    target_logits: torch.Tensor,  # [B, G+1, V]
    draft_tokens: torch.Tensor,  # [B, G] int64
    *,
    argmax: Callable[[torch.Tensor], torch.Tensor] = _torch_argmax,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature 0 in every mode: accept the drafts that equal the target argmax.

    torch.argmax returns the first maximal index, and so do the Triton kernels: ties go to
    the lowest token id. `argmax` ([..., V] -> [...] int64 over the last dimension) must keep
    that rule; the fused CPU paths pass `_common.first_argmax`, numpy's argmax (cheaper on CPU,
    docs/benchmarks.md), and get the same (n, next_token) bit for bit.
    """
    G = draft_tokens.shape[1]
    best = argmax(target_logits)  # [B, G+1]
    n = (draft_tokens == best[:, :G]).long().cumprod(dim=-1).sum(dim=-1)  # [B]
    return n, best.gather(1, n[:, None]).squeeze(1)


def accepted_count(accepted: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of each row: [B, G] bool -> [B] int64."""
    return accepted.long().cumprod(dim=-1).sum(dim=-1)


def baseline(
    target_logits: torch.Tensor,  # [B, G+1, V]
    draft_logits: torch.Tensor,  # [B, G, V]
    draft_tokens: torch.Tensor,  # [B, G] int64
    uniforms: torch.Tensor,  # [B, G]
    noise: torch.Tensor,  # [B, V] or [B, G+1, V]
    *,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unfused reference: returns (n_accepted [B] int64, next_token [B] int64)."""
    if temperature == 0:
        return greedy(target_logits, draft_tokens)
    B, G = draft_tokens.shape
    p = torch.softmax(target_logits.float() / temperature, dim=-1)  # [B, G+1, V] target probs
    q = torch.softmax(draft_logits.float() / temperature, dim=-1)  # [B, G, V] draft probs
    tok = draft_tokens.unsqueeze(-1)  # [B, G, 1]
    p_tok = p[:, :G].gather(-1, tok).squeeze(-1)  # [B, G] p_i(d_i)
    q_tok = q.gather(-1, tok).squeeze(-1)  # [B, G] q_i(d_i)
    n = accepted_count(uniforms <= p_tok / q_tok)  # [B]
    rows = torch.arange(B, device=p.device)
    p_n = p[rows, n]  # [B, V]
    q_n = q[rows, n.clamp(max=G - 1)] * (n < G).float()[:, None]  # [B, V]; q_G := 0
    return n, sample_residual(p_n, q_n, noise_at(noise, n))
