"""γ policies: how many draft tokens to propose at the next verify pass.

- auto:      fixed on CPU, adaptive elsewhere (see `make_policy`).
- fixed:     γ never changes.
- adaptive:  start at γ0; +2 when every proposed token was accepted, otherwise −1; γ >= 1;
             a run the draft-confidence stop ended early leaves γ as it is.
- analytic:  choose γ maximising expected tokens per second,

      E[tokens | γ] = (1 − α^(γ+1)) / (1 − α)
      time(γ)       = γ · t_draft + t_target(γ + 1)

  with α, t_draft and the target's cost curve t_target(k) measured online (an untried k is
  assumed as cheap as the measurements allow, so it gets tried only if it could win). With a
  constant target cost this is the classic (1 − α^(γ+1)) / ((1 − α)(γc + 1)), c = t_draft /
  t_target; on a CPU the target pass grows with k, which this policy accounts for.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per verify pass when each draft token is accepted with prob. α."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def theoretical_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al.'s expected speedup over autoregressive decoding, constant target cost."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def best_speedup(alpha: float, c: float, verify: dict[int, float]) -> tuple[float, int]:
    """The best speedup any fixed γ can give, and that γ: max over the γ with a measured
    v(γ+1) of E[tokens | γ] / (v(γ+1) + γc), where verify[k] = v(k) = (target pass over k
    tokens) / (target pass over 1 token). With v ≡ 1 this is the best
    `theoretical_speedup`. It counts no per-window costs and no loop overhead, so it bounds
    what the decoding loop can reach with this draft on this machine."""
    gammas = [k - 1 for k in verify if k >= 2]
    return max(((expected_tokens(alpha, g) / (verify[g + 1] + g * c), g) for g in gammas), default=(0.0, 0))


def crossing(goal: float, f, lo: float, hi: float) -> float | None:
    """Where the monotone f reaches `goal` on [lo, hi], by bisection: the least x with
    f(x) >= goal if f rises, the greatest if it falls; None if f stays below goal."""
    a, b = f(lo) >= goal, f(hi) >= goal
    if not (a or b):
        return None
    if a and b:
        return lo if f(lo) <= f(hi) else hi
    for _ in range(60):  # invariant: f(lo) >= goal is a, f(hi) >= goal is b
        mid = (lo + hi) / 2
        if (f(mid) >= goal) == a:
            lo = mid
        else:
            hi = mid
    return hi if b else lo


class GammaPolicy:
    wants_times = False  # the loop times its phases for this policy even without DecodeOptions.timing

    def next(self) -> int:
        raise NotImplementedError

    def update(
        self, gamma: int, accepted: int, draft_s: float = 0.0, target_s: float = 0.0, stopped: bool = False
    ) -> None:
        """Feedback from one verify pass: γ used, the fewest accepted over the batch's rows,
        the wall time of the draft's γ steps and of the target pass, and whether the
        draft-confidence stop ended the run before the γ this policy asked for."""


@dataclass
class FixedGamma(GammaPolicy):
    gamma: int

    def next(self) -> int:
        return self.gamma


@dataclass
class AdaptiveGamma(GammaPolicy):
    gamma: int = 5
    gamma_max: int = 16

    def next(self) -> int:
        return self.gamma

    def update(
        self, gamma: int, accepted: int, draft_s: float = 0.0, target_s: float = 0.0, stopped: bool = False
    ) -> None:
        if stopped:  # the stop, not γ, ended this run: it says nothing about γ
            return
        if accepted >= gamma:
            self.gamma = min(self.gamma_max, gamma + 2)
        else:
            self.gamma = max(1, gamma - 1)


@dataclass
class AnalyticGamma(GammaPolicy):
    """Maximises E[tokens]/time with measured α, draft step cost and target cost curve."""

    wants_times = True

    gamma: int = 5  # the first pass's γ; afterwards the last choice
    gamma_max: int = 16
    alpha_prior: float = 0.7  # α before any evidence, as pseudo-counts below
    decay: float = 0.95  # exponential forgetting of old evidence
    _acc: float = field(default=3.5, repr=False)  # decayed accepted count (prior 0.7 × 5)
    _tries: float = field(default=5.0, repr=False)  # decayed proposed-and-judged count
    _draft_step: float | None = field(default=None, repr=False)
    _target: dict[int, float] = field(default_factory=dict, repr=False)  # k -> seconds (EMA)

    @property
    def alpha(self) -> float:
        return min(0.999, self._acc / self._tries) if self._tries else self.alpha_prior

    def update(
        self, gamma: int, accepted: int, draft_s: float = 0.0, target_s: float = 0.0, stopped: bool = False
    ) -> None:
        # per-token acceptance: `accepted` successes, plus one failure if the run stopped early
        judged = accepted + (1 if accepted < gamma else 0)
        self._acc = self.decay * self._acc + accepted
        self._tries = self.decay * self._tries + judged
        if gamma > 0 and draft_s > 0:
            step = draft_s / gamma
            self._draft_step = step if self._draft_step is None else 0.8 * self._draft_step + 0.2 * step
        if target_s > 0:
            k = gamma + 1
            old = self._target.get(k)
            self._target[k] = target_s if old is None else 0.8 * old + 0.2 * target_s

    def target_cost(self, k: int) -> float:
        """An optimistic t_target(k): measured where known; else the dearest measurement at
        fewer tokens (the cost never falls as k grows), or 0 when none is below (so the
        smallest γ gets tried once). Optimism makes an untried γ worth trying only if it
        could beat the measured ones."""
        if k in self._target:
            return self._target[k]
        return max((t for j, t in self._target.items() if j < k), default=0.0)

    def next(self) -> int:
        if self._draft_step is None or not self._target:
            return self.gamma
        a = self.alpha
        rates = {
            g: expected_tokens(a, g) / (g * self._draft_step + self.target_cost(g + 1))
            for g in range(1, self.gamma_max + 1)
        }
        self.gamma = max(rates, key=rates.get)
        return self.gamma


def make_policy(name: str, gamma: int, gamma_max: int, device: str = "cpu") -> GammaPolicy:
    """`auto` is fixed on CPU, where verifying k tokens costs more with every k (so long drafts
    that are all accepted are not worth growing), and adaptive on accelerators, where a pass
    over 2–20 tokens costs about one step. Both are deterministic, so seeded sampling
    repeats exactly; analytic is not (its γ follows measured times)."""
    if name == "auto":
        name = "fixed" if device == "cpu" else "adaptive"
    if name == "fixed":
        return FixedGamma(gamma)
    if name == "adaptive":
        return AdaptiveGamma(gamma, gamma_max)
    if name == "analytic":
        return AnalyticGamma(gamma, gamma_max)
    raise ValueError(f"unknown gamma policy {name!r}")
