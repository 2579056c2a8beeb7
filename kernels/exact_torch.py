"""The `exact` verifier's fused torch path (CPU, or `backend="torch"`).

It returns the same (n_accepted, next_token) as `reference.baseline` on the same inputs, up
to fp32 rounding in exp and in the reduction order (the tests check equality). The Triton
kernels of the same mode are in `exact_triton`.

Design, shared with the kernels. The ratio test needs only each row's normaliser and the two
logits at the drafted token: p_i(d_i) / q_i(d_i) = exp((t_i[d_i] − lse_t_i) − (s_i[d_i] −
lse_s_i)) with t, s the target and draft logits / T. A pass over V is needed only for the one
row pair that is sampled from (first rejection, or the bonus row G), and the exponential race
argmax(w / E) samples from the residual w without its normaliser. `reference.baseline`, like
the paper's code, instead materialises p and q over V for every row.

On CPU every torch op costs dispatch and thread start-up comparable to one pass over a
Whisper-sized row, so this path trades passes against op count; docs/kernels.md ("CPU notes")
explains the choices and docs/benchmarks.md has the measurements.
"""

import torch

from ._common import first_argmax
from .reference import accepted_count, greedy, noise_at, sample_residual


def exact_torch(
    target_logits: torch.Tensor,  # [B, G+1, V]
    draft_logits: torch.Tensor,  # [B, G, V]
    draft_tokens: torch.Tensor,  # [B, G] int64
    uniforms: torch.Tensor,  # [B, G]
    noise: torch.Tensor,  # [B, V] or [B, G+1, V]
    *,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused torch path: p and q over V exist only for row n; one pass of exp over the rest.

    All 2G+1 rows live in one fp32 buffer that is turned in place into u = exp(z − max z):
    the ratio test needs u at the drafted tokens and the row sums, and row n's p and q are
    u / sum. Target and draft rows share one reduction, so p == q stays bitwise exact when
    their logits are equal. Every row must have a finite logit (a sampled row always does).

    On CPU the draw from row n is per batch row with host scalars (reading n costs nothing
    there): the race is over w / a = u_t − (a_d / a_t) u_d, one pass, with a_t = 1/Σu_t and
    a_d = 1/Σu_d; scaling w by 1/a_t changes no argmax. Elsewhere it stays vectorised, with
    no host synchronisation.
    """
    if temperature == 0:
        return greedy(target_logits, draft_tokens, argmax=first_argmax)
    B, G = draft_tokens.shape
    V = target_logits.shape[-1]
    u = torch.empty(B, 2 * G + 1, V, dtype=torch.float32, device=target_logits.device)
    for rows, logits in ((slice(0, G + 1), target_logits), (slice(G + 1, None), draft_logits)):
        if logits.dtype != torch.float32:  # upcast in place first: mixed-dtype ops are slow on CPU
            logits = u[:, rows].copy_(logits)
        top = logits.amax(dim=-1, keepdim=True)  # max z = max(logits) / T, as /T is monotone
        torch.add(-top / temperature, logits, alpha=1.0 / temperature, out=u[:, rows])  # z − max z
    u.exp_()  # u = exp(z − max z), rows 0..G target, G+1..2G draft
    inv_sum = u.sum(dim=-1).reciprocal_()  # [B, 2G+1] 1 / Σ_v u
    tok = draft_tokens.unsqueeze(-1)  # [B, G, 1]
    at_tok = u.gather(-1, torch.cat([tok, tok[:, :1], tok], dim=1)).squeeze(-1) * inv_sum  # [B, 2G+1]
    p_tok, q_tok = at_tok[:, :G], at_tok[:, G + 1 :]  # [B, G] p_i(d_i), q_i(d_i)
    n = accepted_count(uniforms <= p_tok / q_tok)  # [B]
    if u.device.type == "cpu":
        return n, _draw_cpu(u, inv_sum, n, noise, G)
    rows = torch.arange(B, device=u.device)
    p_n = u[rows, n] * inv_sum[rows, n, None]  # [B, V]
    d_row = G + 1 + n.clamp(max=G - 1)  # draft row n (any draft row when n = G: zeroed)
    q_n = u[rows, d_row] * (inv_sum[rows, d_row] * (n < G).float())[:, None]  # [B, V]; q_G := 0
    return n, sample_residual(p_n, q_n, noise_at(noise, n))


def _draw_cpu(
    u: torch.Tensor,  # [B, 2G+1, V] exp(z − max z), overwritten
    inv_sum: torch.Tensor,  # [B, 2G+1]
    n: torch.Tensor,  # [B]
    noise: torch.Tensor,  # [B, V] or [B, G+1, V]
    G: int,
) -> torch.Tensor:
    """`sample_residual` on CPU, one batch row at a time: [B] int64, the same draw.

    Three passes over V per row (subtract, divide, argmax) where the vectorised form takes
    about eight, and no row copies: row n is a view of u.
    """
    inv = inv_sum.tolist()
    tokens = []
    for b, n_b in enumerate(n.tolist()):
        e = (noise[b] if noise.dim() == 2 else noise[b, n_b]).float()  # [V] Exp(1)
        p_row = u[b, n_b]  # [V] ∝ p_n
        if n_b == G:  # bonus token: the residual is p_G itself
            tokens.append(int(first_argmax(p_row.div_(e))))
            continue
        d = G + 1 + n_b
        race = torch.add(p_row, u[b, d], alpha=-(inv[b][d] / inv[b][n_b])).div_(e)  # [V] ∝ (p − q) / E
        i = int(first_argmax(race))
        if not race[i] > 0:  # max(0, p − q) ≡ 0 (p == q): draw from p_n instead
            i = int(first_argmax(p_row / e))
        tokens.append(i)
    return torch.tensor(tokens, dtype=torch.long)
