"""Inputs for the verifier tests: seeded random batches and crafted cases with known tokens.

Shared by the torch, interpreter and CUDA test modules, so every backend meets the same cases.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from specasr.kernels import make_randomness

NEG = float("-inf")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@functools.lru_cache(maxsize=4)
def _logits(B: int, G: int, V: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    target = 4.0 * torch.randn(B, G + 1, V, generator=g) + 5.0  # [B, G+1, V]
    draft = target[:, :G] + 1.5 * torch.randn(B, G, V, generator=g)  # [B, G, V]
    suppressed = torch.randint(0, V, (8,), generator=g)
    target[..., suppressed] = NEG
    draft[..., suppressed] = NEG
    return target, draft


def random_batch(B: int, G: int, V: int, dtype: torch.dtype, T: float, seed: int, device="cpu"):
    """Whisper-scale logits (about −20..+30) with a correlated draft, drafts sampled from q.

    The draft is the target plus noise, so acceptance is neither 0 nor 1 and n covers 0..G.
    A few logits are −inf, as suppression leaves them. Returns the five verify inputs.
    """
    target, draft = (x.to(dtype, copy=True) for x in _logits(B, G, V, seed))
    g = torch.Generator().manual_seed(seed * 31 + round(T * 10))
    if T == 0:
        tokens = draft.float().argmax(-1)  # greedy draft
    else:  # d ~ q by the exponential race
        q = torch.softmax(draft.float() / T, dim=-1)
        tokens = (q / torch.empty_like(q).exponential_(generator=g)).argmax(-1)
    uniforms, noise = make_randomness(B, G, V, g, "cpu")
    return tuple(x.to(device) for x in (target, draft, tokens, uniforms, noise))


@dataclass
class Crafted:
    """One B = 1 verify call with known answers; `expect` maps mode family → (n, next)."""

    name: str
    target: torch.Tensor  # [1, G+1, V]
    draft: torch.Tensor  # [1, G, V]
    tokens: list[int]
    uniforms: list[float]
    temperatures: tuple[float, ...]
    # mode family ("exact" covers baseline and exact, or "sigmoid") → (n, next); next None:
    # compare with the torch reference; a family missing here is checked across backends only
    expect: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    noise: torch.Tensor | None = None  # [1, V]; ones when None
    families: tuple[str, ...] = ("exact", "sigmoid")

    def inputs(self, device="cpu"):
        V = self.target.shape[-1]
        noise = torch.ones(1, V) if self.noise is None else self.noise
        return (
            self.target.to(device),
            self.draft.to(device),
            torch.tensor([self.tokens], device=device),
            torch.tensor([self.uniforms], device=device),
            noise.to(device),
        )


def _rows(G: int, V: int, support: list[list[int]]) -> torch.Tensor:
    """[1, len(support), V] logits: 0 on each row's support, −inf elsewhere."""
    x = torch.full((1, len(support), V), NEG)
    for i, ids in enumerate(support):
        x[0, i, ids] = 0.0
    return x


def crafted_cases(V: int = 20000) -> list[Crafted]:
    """Cases whose tokens are known by hand. Token ids straddle several vocabulary tiles."""
    hi = V - 2500  # a token in a late tile
    cases = []
    # Every draft has p(d) = q(d) = 1/2: ratio 1, all accepted; the bonus row is one-hot.
    cases.append(Crafted(
        "all_accepted", _rows(3, V, [[10, hi], [11, hi], [12, hi], [hi + 1]]),
        _rows(3, V, [[10, hi - 1], [11, hi - 1], [12, hi - 1]]), [10, 11, 12], [0.99] * 3,
        (0.0, 0.7, 1.0), {"exact": (3, hi + 1), "sigmoid": (3, hi + 1)},
    ))  # fmt: skip
    # p(d_0) = 0 < q(d_0): rejected at once; the residual is all on token `hi`.
    cases.append(Crafted(
        "first_rejected", _rows(3, V, [[hi], [11], [12], [13]]), _rows(3, V, [[10], [11], [12]]),
        [10, 11, 12], [0.5] * 3, (0.0, 0.7, 1.0), {"exact": (0, hi), "sigmoid": (0, hi)},
    ))  # fmt: skip
    # Reduced-vocabulary draft: q has no mass on `hi`, p has half; ratio 1/2 < r = 3/4.
    cases.append(Crafted(
        "q_zero_mass_where_p_has_mass", _rows(1, V, [[10, hi], [7]]), _rows(1, V, [[10]]),
        [10], [0.75], (0.7, 1.0), {"exact": (0, hi), "sigmoid": (1, 7)},
    ))  # fmt: skip
    # A drafted token with q(d) = 0: accepted when p(d) > 0 (ratio +inf) ...
    cases.append(Crafted(
        "q_zero_at_draft_p_positive", _rows(2, V, [[20, 30], [hi], [5]]), _rows(2, V, [[30], [40]]),
        [20, 40], [0.999, 0.5], (0.7, 1.0), {"exact": (1, hi), "sigmoid": (1, hi)},
    ))  # fmt: skip
    # ... and rejected when p(d) = 0 too (0/0 is NaN, and r <= NaN is false).
    cases.append(Crafted(
        "q_zero_at_draft_p_zero", _rows(1, V, [[hi], [5]]), _rows(1, V, [[30]]),
        [20], [0.0], (0.7, 1.0), {"exact": (0, hi), "sigmoid": (0, hi)},
    ))  # fmt: skip
    # Bonus row: logits −10, except 0 at 700 and `hi` and a suppressed (−inf) token 5 that
    # carries the smallest noise, so it would win any race it could enter (in sigmoid mode
    # too, were −inf clamped to α). The race between 700 and `hi` (equal mass) goes to the
    # smaller noise, `hi`; at T = 0 they tie and the lower id, 700, wins.
    noise = torch.ones(1, V)
    noise[0, 5], noise[0, 700], noise[0, hi] = 1e-30, 0.5, 0.25
    bonus = torch.full((1, 1, V), -10.0)
    bonus[0, 0, [700, hi]] = 0.0
    bonus[0, 0, 5] = NEG
    cases.append(Crafted(
        "suppressed_never_sampled", torch.cat([_rows(1, V, [[9]]), bonus], 1), _rows(1, V, [[9]]),
        [9], [0.5], (0.7, 1.0), {"exact": (1, hi), "sigmoid": (1, hi)}, noise,
    ))  # fmt: skip
    cases.append(Crafted(
        "tie_greedy_lowest_id", torch.cat([_rows(1, V, [[9]]), bonus], 1), _rows(1, V, [[9]]),
        [9], [0.5], (0.0,), {"exact": (1, 700), "sigmoid": (1, 700)}, noise,
    ))  # fmt: skip
    # Greedy tie inside the drafted row: argmax is the lower id 100, so drafting `hi` fails.
    tie = _rows(1, V, [[100, hi], [3]])
    cases.append(Crafted(
        "tie_greedy_rejects_higher_id", tie, _rows(1, V, [[hi]]), [hi], [0.5], (0.0,),
        {"exact": (0, 100), "sigmoid": (0, 100)},
    ))  # fmt: skip
    # Race tie at T > 0: equal mass, equal noise: the lower id wins.
    cases.append(Crafted(
        "tie_race_lowest_id", _rows(1, V, [[9], [300, hi]]), _rows(1, V, [[9]]), [9], [0.5],
        (0.7, 1.0), {"exact": (1, 300), "sigmoid": (1, 300)},
    ))  # fmt: skip
    # p == q on every drafted row (same random logits): ratio exactly 1, all accepted for
    # any r < 1; the bonus token is whatever the race on p_G gives (checked across backends).
    g = torch.Generator().manual_seed(7)
    same = 3.0 * torch.randn(1, 3, V, generator=g)
    target = torch.cat([same, 3.0 * torch.randn(1, 1, V, generator=g)], 1)
    noise_pq = torch.empty(1, V).exponential_(generator=g)
    cases.append(Crafted(
        "p_equals_q", target, same.clone(), same[0].argmax(-1).tolist(), [1 - 2**-24] * 3,
        (0.0, 0.7, 1.0), {"exact": (3, None), "sigmoid": (3, None)}, noise_pq,
    ))  # fmt: skip
    # Sigmoid only: draft logits above the target's everywhere, so p̂ < q̂ and the residual
    # max(0, p̂ − q̂) is identically zero; the token falls back to the race on p̂_0.
    t0 = 3.0 * torch.randn(1, 2, V, generator=g)
    cases.append(Crafted(
        "sigmoid_residual_zero", t0, t0[:, :1] + 200.0, [int(t0[0, 0].argmax())], [1 - 2**-24],
        (1.0,), {}, noise_pq, families=("sigmoid",),
    ))  # fmt: skip
    return cases


def emitted_tv(verifier, p_logits, q_logits, N: int, seed: int) -> list[float]:
    """Total-variation distance between the verifier's emitted token at each position k and p_k.

    p_logits: [G+1, V], q_logits: [G, V] fixed across N independent calls (the target's rows
    do not depend on the prefix, a valid model). Drafts d_i ~ q_i. Position k is emitted when
    n >= k, as d_k (k < n) or as the sampled token (k = n); speculative sampling guarantees
    the emitted token at k is distributed as p_k given that it is emitted.
    """
    G, V = q_logits.shape
    g = torch.Generator().manual_seed(seed)
    p, q = torch.softmax(p_logits, -1), torch.softmax(q_logits, -1)
    tokens = torch.stack([torch.multinomial(q[i], N, replacement=True, generator=g) for i in range(G)], 1)
    uniforms, noise = make_randomness(N, G, V, g, "cpu")
    target = p_logits.expand(N, G + 1, V)
    draft = q_logits.expand(N, G, V)
    n, nxt = verifier(target, draft, tokens, uniforms, noise)
    tvs = []
    for k in range(G + 1):
        emitted = n >= k
        tok_k = torch.where(n == k, nxt, tokens[:, min(k, G - 1)])[emitted]
        freq = torch.bincount(tok_k, minlength=V).double() / max(1, int(emitted.sum()))
        tvs.append(0.5 * (freq - p[k].double()).abs().sum().item())
    return tvs


def check_triton_matches_reference(B: int, G: int, V: int, dtype: torch.dtype, T: float, device, seed=0):
    """The Triton backend gives the reference's (n, next): exact vs baseline on the fp32
    upcast, sigmoid vs its torch path (T = 0: the shared greedy kernel vs argmax matching)."""
    from specasr.kernels import verify
    from specasr.kernels.reference import baseline
    from specasr.kernels.sigmoid import sigmoid_torch

    inputs = random_batch(B, G, V, dtype, T, seed, device)
    ref_inputs = (inputs[0].float(), inputs[1].float(), *inputs[2:])
    modes = ("exact",) if T == 0 else ("exact", "sigmoid")
    for mode in modes:
        n, nxt = verify(*inputs, temperature=T, mode=mode, backend="triton")
        ref = baseline if mode == "exact" else sigmoid_torch
        n_ref, nxt_ref = ref(*ref_inputs, temperature=T)
        assert n.device == inputs[0].device and n.dtype == nxt.dtype == torch.int64
        assert torch.equal(n, n_ref) and torch.equal(nxt, nxt_ref), (mode, n, n_ref, nxt, nxt_ref)


def check_crafted_triton(case: Crafted, device):
    """The Triton backend gives the crafted case's known tokens and agrees with torch."""
    from specasr.kernels import verify

    for family in case.families:
        for T in case.temperatures:
            n, nxt = verify(*case.inputs(device), temperature=T, mode=family, backend="triton")
            n_ref, nxt_ref = verify(*case.inputs(), temperature=T, mode=family, backend="torch")
            assert (n.item(), nxt.item()) == (n_ref.item(), nxt_ref.item()), (family, T)
            if family in case.expect:
                n_exp, next_exp = case.expect[family]
                assert n.item() == n_exp and next_exp in (None, nxt.item()), (family, T)
