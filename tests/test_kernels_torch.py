"""The torch verifiers on CPU: baseline (the reference), the fused exact path, sigmoid.

Kinds of test, as in vLLM's rejection-sampler suite: crafted logits with known tokens, seeded
equality between backends, and a statistical test that emitted tokens follow the target p.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from kernel_cases import DTYPES, crafted_cases, emitted_tv, random_batch
from specasr.kernels import MODES, make_randomness, verify
from specasr.kernels._common import first_argmax
from specasr.kernels.exact_torch import exact_torch
from specasr.kernels.exact_triton import INTERPRETED
from specasr.kernels.reference import baseline, greedy, sample_residual
from specasr.kernels.sigmoid import DEFAULT_SCALE, sigmoid_prob, sigmoid_torch

GRID = list(itertools.product((1, 2, 5), (1, 4, 7), (1000, 51864, 51865, 51866)))


@pytest.mark.parametrize(("B", "G", "V"), GRID, ids=[f"B{b}-g{g}-V{v}" for b, g, v in GRID])
def test_exact_torch_equals_baseline(B, G, V):
    """Identical (n, next) on identical inputs, for fp32/fp16/bf16 and T in {0, 0.7, 1};
    the reference runs on the fp32 upcast of the same logits."""
    for dtype, T in itertools.product(DTYPES.values(), (0.0, 0.7, 1.0)):
        inputs = random_batch(B, G, V, dtype, T, seed=B * 1000 + G * 100 + V % 97)
        ref_inputs = (inputs[0].float(), inputs[1].float(), *inputs[2:])
        n, nxt = exact_torch(*inputs, temperature=T)
        n_ref, nxt_ref = baseline(*ref_inputs, temperature=T)
        assert torch.equal(n, n_ref) and torch.equal(nxt, nxt_ref), (dtype, T, n, n_ref, nxt, nxt_ref)
        assert n.dtype == nxt.dtype == torch.int64 and ((0 <= n) & (n <= G)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_cpu_argmax_matches_torch(dtype):
    """The numpy argmax behind exact's CPU path picks torch's index: ties to the lowest id,
    −inf rows, NaN as maximal, strided views."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 4, (6, 51865), generator=g).to(dtype)  # many ties per row
    x[1] = float("-inf")
    x[2, 17] = float("nan")
    x[3, ::5] = float("-inf")
    for view in (x, x[:, 1:], x[::2], x.T.contiguous().T):
        assert torch.equal(first_argmax(view), torch.argmax(view, dim=-1)), view.stride()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_greedy_with_cpu_argmax_equals_reference(dtype):
    """`greedy(..., argmax=first_argmax)`, the CPU path at T = 0, gives the reference's
    (n, next) bit for bit, ties included: a draft on a tied maximum other than the lowest id
    is rejected."""
    g = torch.Generator().manual_seed(4)
    B, G, V = 5, 4, 51865
    target = torch.randint(0, 3, (B, G + 1, V), generator=g).to(dtype)  # thousands of tied maxima
    target[:2, 2] = float("-inf")
    target[:2, 2, [7, 9000]] = 1.0  # two tied finite tokens in an otherwise −inf row
    tokens = torch.argmax(target[:, :G], dim=-1)  # [B, G] every draft the lowest maximal id
    tokens[1, 2] = 9000  # tied with 7 but not the lowest: rejected at 2, next 7
    tokens[2, 0] = (target[2, 0] == target[2, 0].max()).nonzero()[-1].item()  # last tied max
    tokens[3, 3] = (target[3, 3] < target[3, 3].max()).nonzero()[0].item()  # not a maximum
    n_ref, next_ref = greedy(target, tokens)
    n, nxt = greedy(target, tokens, argmax=first_argmax)
    assert n_ref.tolist() == [4, 2, 0, 3, 4] and next_ref[1] == 7  # the cases above
    assert torch.equal(n, n_ref) and torch.equal(nxt, next_ref), (n, n_ref, nxt, next_ref)
    assert n.dtype == nxt.dtype == torch.int64


def test_random_batches_exercise_every_branch():
    """The equality grid is not vacuous: n spans rejection at 0, in the middle, and all accepted."""
    seen = set()
    for seed in range(6):
        n, _ = baseline(*random_batch(5, 4, 1000, torch.float32, 1.0, seed), temperature=1.0)
        seen |= set(n.tolist())
    assert {0, 4} <= seen and len(seen) >= 4


@pytest.mark.parametrize("case", crafted_cases(), ids=lambda c: c.name)
def test_crafted_cases_torch(case):
    impls = {"exact": [baseline, exact_torch], "sigmoid": [sigmoid_torch]}
    for family, T in itertools.product(case.families, case.temperatures):
        for impl in impls[family]:
            n, nxt = impl(*case.inputs(), temperature=T)
            if family in case.expect:
                n_exp, next_exp = case.expect[family]
                assert n.item() == n_exp, (impl.__name__, T)
                if next_exp is not None:
                    assert nxt.item() == next_exp, (impl.__name__, T)
            n_ref, nxt_ref = impls[family][0](*case.inputs(), temperature=T)
            assert (n.item(), nxt.item()) == (n_ref.item(), nxt_ref.item()), (impl.__name__, T)


def test_sigmoid_residual_zero_falls_back_to_p_hat():
    case = next(c for c in crafted_cases() if c.name == "sigmoid_residual_zero")
    target, draft, tokens, uniforms, noise = case.inputs()
    n, nxt = sigmoid_torch(target, draft, tokens, uniforms, noise, temperature=1.0)
    p_hat = sigmoid_prob(target[0, 0], *DEFAULT_SCALE)
    assert (sigmoid_prob(draft[0, 0], *DEFAULT_SCALE) > p_hat).all()  # residual ≡ 0
    assert n.item() == 0 and nxt.item() == int(torch.argmax(p_hat / noise[0]))


def test_sample_residual_falls_back_to_p_when_residual_is_zero():
    p = torch.tensor([[0.1, 0.6, 0.3]])
    noise = torch.tensor([[1.0, 2.0, 0.5]])
    assert sample_residual(p, p.clone(), noise).item() == 2  # argmax p / E = [0.1, 0.3, 0.6]
    q = torch.tensor([[0.0, 0.9, 0.1]])  # residual (0.1, 0, 0.2) / E = (0.1, 0, 0.4)
    assert sample_residual(p, q, noise).item() == 2
    assert sample_residual(p, q, torch.tensor([[0.1, 1.0, 1.0]])).item() == 0


def test_sigmoid_formula_and_default_scale():
    z = torch.tensor([-2e3, -20.0, 0.0, 30.0, 2e3, float("-inf")])
    alpha, beta = DEFAULT_SCALE
    expected = torch.sigmoid((z.clamp(alpha, beta) - alpha) / (beta - alpha))
    expected[-1] = 0.0  # suppressed tokens get no mass
    torch.testing.assert_close(sigmoid_prob(z, alpha, beta), expected)
    # Whisper's logit range maps to p̂ within 0.3% of σ(1/2) ≈ 0.6225: almost flat.
    p_hat = sigmoid_prob(torch.linspace(-20, 30, 101), alpha, beta)
    assert p_hat.min() > 0.619 and p_hat.max() < 0.626


def _always_accept(target, draft, tokens, uniforms, noise):
    """Wrong verifier: accept every draft, then draw the bonus token from p_G."""
    ones = torch.zeros_like(uniforms)  # r = 0 passes every ratio test with p > 0
    return exact_torch(target, draft, tokens, ones, noise, temperature=1.0)


def _resample_from_p(target, draft, tokens, uniforms, noise):
    """Wrong verifier: the classic bug of drawing the rejected position from p, not p − q."""
    n, _ = exact_torch(target, draft, tokens, uniforms, noise, temperature=1.0)
    return n, sample_residual(torch.softmax(target[torch.arange(len(n)), n], -1), torch.zeros(1), noise)


# Emitted-token TV bound: with N_k >= 100k samples over V = 6 tokens,
# P(TV > 0.01) = P(L1 > 0.02) <= (2^V - 2) exp(-N_k 0.02^2 / 2) < 62 e^-20 < 2e-7
# (Bretagnolle-Huber-Carol), so a correct verifier fails by chance with negligible probability.
TV_BOUND = 0.01
P_LOGITS = torch.tensor([[1.0, 0.2, -0.5, 0.8, -1.0, 0.0], [0.3, 1.2, -0.2, 0.0, 0.5, -0.8],
                         [-0.5, 0.4, 1.0, 0.2, -0.3, 0.6]])  # fmt: skip
Q_LOGITS = torch.tensor([[0.2, 1.0, 0.3, -0.4, 0.1, 0.5], [1.0, 0.1, 0.4, -0.6, 0.9, 0.2]])
N_DRAWS = 400_000


@pytest.mark.parametrize("verifier", ["baseline", "exact"])
def test_emitted_tokens_follow_target_distribution(verifier):
    impl = {"baseline": baseline, "exact": exact_torch}[verifier]
    tvs = emitted_tv(lambda *a: impl(*a, temperature=1.0), P_LOGITS, Q_LOGITS, N_DRAWS, seed=1)
    assert max(tvs) < TV_BOUND, tvs


@pytest.mark.parametrize("wrong", [_always_accept, _resample_from_p], ids=lambda f: f.__name__)
def test_distribution_test_rejects_a_wrong_verifier(wrong):
    """The same statistic flags biased verifiers, so the test above can fail."""
    tvs = emitted_tv(wrong, P_LOGITS, Q_LOGITS, N_DRAWS, seed=1)
    assert max(tvs) > 3 * TV_BOUND, tvs


def test_make_randomness_is_seeded():
    a = make_randomness(3, 4, 100, torch.Generator().manual_seed(5), "cpu")
    b = make_randomness(3, 4, 100, torch.Generator().manual_seed(5), "cpu")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    uniforms, noise = a
    assert uniforms.shape == (3, 4) and noise.shape == (3, 100) and noise.dtype == torch.float32
    assert ((0 <= uniforms) & (uniforms < 1)).all() and (noise > 0).all()
    assert math.isclose(noise.mean().item(), 1.0, abs_tol=0.1)  # Exp(1)


@pytest.mark.parametrize("mode", MODES)
def test_noise_per_position_uses_the_sampled_row(mode):
    """noise [B, G+1, V] draws row n's token from noise[:, n]; other rows are ignored."""
    B, G, V = 5, 4, 1000
    target, draft, tokens, uniforms, noise = random_batch(B, G, V, torch.float32, 1.0, seed=3)
    n, nxt = verify(target, draft, tokens, uniforms, noise, temperature=1.0, mode=mode)
    noise3 = torch.rand(B, G + 1, V) + 0.5
    noise3[torch.arange(B), n] = noise
    assert torch.equal(verify(target, draft, tokens, uniforms, noise3, temperature=1.0, mode=mode)[1], nxt)


def test_verify_dispatches_and_validates():
    inputs = random_batch(2, 3, 500, torch.float32, 1.0, seed=0)
    assert torch.equal(
        verify(*inputs, temperature=1.0, mode="exact")[1], exact_torch(*inputs, temperature=1.0)[1]
    )
    # At T = 0 every mode is argmax matching: n = the length of the prefix of drafts that equal
    # the target's argmax, next = the argmax at n. Greedy drafts, so n varies across rows.
    B, G = 5, 3
    greedy_inputs = random_batch(B, G, 500, torch.float32, 0.0, seed=0)
    best = greedy_inputs[0].argmax(-1).tolist()  # [B][G+1]
    n_exp, next_exp = [], []
    for b, drafts in enumerate(greedy_inputs[2].tolist()):
        n_b = next((i for i in range(G) if drafts[i] != best[b][i]), G)
        n_exp.append(n_b)
        next_exp.append(best[b][n_b])
    assert len(set(n_exp)) >= 2, n_exp  # not vacuous: rows reject at different positions
    for mode in MODES:
        n, nxt = verify(*greedy_inputs, temperature=0.0, mode=mode, backend="torch")
        assert n.tolist() == n_exp and nxt.tolist() == next_exp, (mode, n, n_exp, nxt, next_exp)
    # At T > 0 exact draws baseline's tokens, and sigmoid (lossy) those of its torch path.
    sampled = random_batch(B, G, 500, torch.float32, 1.0, seed=0)
    expected = {"baseline": baseline, "exact": baseline, "sigmoid": sigmoid_torch}
    for mode in MODES:
        n, nxt = verify(*sampled, temperature=1.0, mode=mode, backend="torch")
        n_ref, next_ref = expected[mode](*sampled, temperature=1.0)
        assert torch.equal(n, n_ref) and torch.equal(nxt, next_ref), (mode, n, n_ref, nxt, next_ref)
    with pytest.raises(ValueError, match="mode"):
        verify(*inputs, temperature=1.0, mode="fast")
    with pytest.raises(ValueError, match="backend"):
        verify(*inputs, temperature=1.0, mode="exact", backend="cuda")
    with pytest.raises(ValueError, match="temperature"):
        verify(*inputs, temperature=-1.0, mode="exact")
    with pytest.raises(ValueError, match="draft_logits"):
        verify(inputs[0], inputs[1][:, :2], *inputs[2:], temperature=1.0, mode="exact")
    with pytest.raises(ValueError, match="sigmoid_scale"):
        verify(*inputs, temperature=1.0, mode="sigmoid", sigmoid_scale=(1.0, -1.0))
    if not INTERPRETED:
        with pytest.raises(ValueError, match="CUDA"):
            verify(*inputs, temperature=1.0, mode="exact", backend="triton")
