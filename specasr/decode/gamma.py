"""γ policies: how many draft tokens to propose at the next verify pass.

- auto:      fixed with backoff on CPU, adaptive elsewhere (see `make_policy`).
- backoff:   wraps another policy and falls back to γ = 0 (target-only steps) while the
             acceptance it has counted says speculation cannot pay at the stored cost curve,
             probing with one speculative pass every `probe_after` target steps.
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

import functools
from dataclasses import dataclass, field

from specasr.constants import COST_KEYS


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


@dataclass(frozen=True)
class SpeculationCost:
    """What speculation costs on a device, relative to one target step: c = draft step ÷
    target step, verify[k] = v(k) = target pass over k tokens ÷ pass over one. Stored
    numbers, never timed in the loop, so a policy built on them stays deterministic."""

    c: float
    verify: dict[int, float]

    def break_even(self) -> float:
        """The least α at which the best fixed γ beats target-only decoding."""
        return crossing(1.0, lambda a: best_speedup(a, self.c, self.verify)[0], 0.0, 0.999) or 1.0

    @functools.cached_property
    def ceiling(self) -> float:
        """The best fixed γ's speedup with a draft that is almost always right (α = 0.999):
        what no acceptance can beat (asked at every backoff step, so computed once)."""
        return best_speedup(0.999, self.c, self.verify)[0]

    def can_pay(self, margin: float = 1.0) -> bool:
        """Whether any fixed γ could beat target-only decoding by `margin`; if not, no
        acceptance ever makes speculation pay."""
        return self.ceiling >= margin

    @classmethod
    def parse(cls, c: str, verify: str) -> SpeculationCost:
        """From metadata strings: c "0.2", verify "2:1.28,3:1.50,…" (v(1) = 1 is implied)."""
        pairs = (item.split(":") for item in verify.split(",") if item.strip())
        return cls(float(c), {1: 1.0} | {int(k): float(v) for k, v in pairs})


def monotone(verify: dict[int, float]) -> dict[int, float]:
    """A measured v(k) with each value raised to the one before it: a pass over more tokens
    never costs less, and a noisy dip would make the policy prefer that γ."""
    out, top = {}, 0.0
    for k in sorted(verify):
        top = max(top, verify[k])
        out[k] = top
    return out


def stored_cost(pair) -> SpeculationCost | None:
    """A distilled draft's stored cost curve for the backoff policy (its `cost_c` and
    `cost_verify` metadata), or None."""
    meta = getattr(getattr(pair, "draft", None), "meta", None) or {}
    if not all(k in meta for k in COST_KEYS):
        return None
    return SpeculationCost.parse(meta["cost_c"], meta["cost_verify"])


# Base and its packaged int8 draft on a CPU (measured: docs/benchmarks.md, "Long-form
# speedup on CPU": c and v(2) … v(5)); break-even α ≈ 0.46. A draft file may
# carry its own (`cost_c`, `cost_verify` metadata); the figures are CPU ones, for CPU policies.
CPU_COST = SpeculationCost(0.177, {1: 1.0, 2: 1.28, 3: 1.50, 4: 1.67, 5: 1.88})

# The same for one row of an int8 target (compute type int8 or int8_bfloat16) with the
# packaged draft's fused C step (`specasr.backends.cpu.fused`): its passes over k tokens cost little
# more than one step, and the draft step a small fraction of one. `python -m
# benchmarks.speedup --compute-type int8 --repeats 15` (the fixture's c and the larger v(k)
# of the fixture and held-out runs, raised to be monotone; measured: docs/benchmarks.md);
# break-even α ≈ 0.2. Judged by `CPU_COST` instead, held-out English fell back to
# target-only steps often enough to lose part of the decoder phase's speedup.
CPU_COST_INT8 = SpeculationCost(
    0.146, {1: 1.0, 2: 1.05, 3: 1.08, 4: 1.08, 5: 1.15, 6: 1.20, 7: 1.23, 8: 1.31}
)

# A batch of B windows on a CPU (the chunked strategy): a pass over B rows × k tokens, relative
# to a one-token step of the same B rows, grows faster with k than at B = 1 (B·k token rows of
# products and of the vocabulary-wide head), and the draft's step reads B rows of cross K/V, so
# c grows too. Base fp32 with its packaged draft (pooling 2): `python -m benchmarks.batch_costs
# --rows 2,4,8 --repeats 30`, the mean of three runs, each v(k) raised to the v(k − 1) before
# it where noise put it below. The pooled draft reads half the cross K/V of an unpooled one,
# which lowers c at large B (measured: docs/benchmarks.md, "Batch cost curves").
CPU_BATCH_COSTS = {
    2: SpeculationCost(0.158, {1: 1.0, 2: 1.00, 3: 1.00, 4: 1.21, 5: 1.29, 6: 1.33, 7: 1.46, 8: 1.46}),
    4: SpeculationCost(0.180, {1: 1.0, 2: 1.20, 3: 1.32, 4: 1.58, 5: 1.80, 6: 1.89, 7: 2.07, 8: 2.10}),
    8: SpeculationCost(0.181, {1: 1.0, 2: 1.26, 3: 1.53, 4: 1.92, 5: 2.19, 6: 2.38, 7: 2.63, 8: 2.68}),
}


# The same for an int8 target (`compute_type` int8 or int8_bfloat16: per-row int8 products,
# row-invariant attention). Its passes over k tokens cost far less more than one step (v(4) 1.2
# against fp32's 1.9 at B = 8), so the fp32 table would cut its γ short and judge a draft
# agreeing 0.5 per token a loss where speculation still gains. `python -m
# benchmarks.batch_costs --rows 2,4,8 --repeats 30 --compute-type int8` with the packaged
# draft, the mean of three runs, raised to be monotone (measured: docs/benchmarks.md).
CPU_BATCH_COSTS_INT8 = {
    2: SpeculationCost(0.220, {1: 1.0, 2: 1.01, 3: 1.05, 4: 1.06, 5: 1.17, 6: 1.25, 7: 1.38, 8: 1.38}),
    4: SpeculationCost(0.193, {1: 1.0, 2: 1.05, 3: 1.11, 4: 1.16, 5: 1.32, 6: 1.41, 7: 1.49, 8: 1.57}),
    8: SpeculationCost(0.157, {1: 1.0, 2: 1.08, 3: 1.14, 4: 1.17, 5: 1.34, 6: 1.44, 7: 1.57, 8: 1.60}),
}


def cpu_batch_costs(int8_target: bool) -> dict[int, SpeculationCost]:
    """The stored batch cost curves for a CPU target: `CPU_BATCH_COSTS_INT8` for an int8 target
    (compute type int8 or int8_bfloat16), else `CPU_BATCH_COSTS`."""
    return CPU_BATCH_COSTS_INT8 if int8_target else CPU_BATCH_COSTS


def batch_cost(rows: int, single: SpeculationCost, batch: dict[int, SpeculationCost]) -> SpeculationCost:
    """The cost curve for a pass over `rows` rows: `single` for one row, else the measured batch
    size nearest below (the largest for more rows than any measured)."""
    below = [b for b in batch if b <= rows]
    return single if rows <= 1 or not below else batch[max(below)]


@dataclass(frozen=True)
class Feedback:
    """One verify pass, as the loop reports it to a γ policy."""

    gamma: int  # γ used
    accepted: int  # the fewest accepted over the batch's rows
    draft_s: float = 0.0  # wall time of the draft's γ steps
    target_s: float = 0.0  # wall time of the target pass
    stopped: bool = False  # the draft-confidence stop ended the run before the γ asked for
    per_row: list[int] | None = None  # each row's accepted count (None: `accepted` is the one row's)

    @property
    def rows(self) -> list[int]:
        return [self.accepted] if self.per_row is None else self.per_row


class GammaPolicy:
    wants_times = False  # the loop times its phases for this policy even without DecodeOptions.timing

    def next(self, rows: int = 1) -> int:
        """γ for the next pass over `rows` rows still decoding."""
        raise NotImplementedError

    def update(
        self,
        gamma: int,
        accepted: int,
        draft_s: float = 0.0,
        target_s: float = 0.0,
        stopped: bool = False,
        per_row: list[int] | None = None,
    ) -> None:
        """Feedback from one verify pass (`Feedback` has the fields), handed to `observe`."""
        self.observe(Feedback(gamma, accepted, draft_s, target_s, stopped, per_row))

    def observe(self, fb: Feedback) -> None:
        """What a policy learns from one verify pass; nothing by default."""


@dataclass
class FixedGamma(GammaPolicy):
    gamma: int

    def next(self, rows: int = 1) -> int:
        return self.gamma


@dataclass
class AdaptiveGamma(GammaPolicy):
    gamma: int = 5
    gamma_max: int = 16

    def next(self, rows: int = 1) -> int:
        return self.gamma

    def observe(self, fb: Feedback) -> None:
        if fb.stopped:  # the stop, not γ, ended this run: it says nothing about γ
            return
        if fb.accepted >= fb.gamma:
            self.gamma = min(self.gamma_max, fb.gamma + 2)
        else:
            self.gamma = max(1, fb.gamma - 1)


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

    def observe(self, fb: Feedback) -> None:
        # per-token acceptance: `accepted` successes, plus one failure if the run stopped early
        judged = fb.accepted + (1 if fb.accepted < fb.gamma else 0)
        self._acc = self.decay * self._acc + fb.accepted
        self._tries = self.decay * self._tries + judged
        if fb.gamma > 0 and fb.draft_s > 0:
            step = fb.draft_s / fb.gamma
            self._draft_step = step if self._draft_step is None else 0.8 * self._draft_step + 0.2 * step
        if fb.target_s > 0:
            k = fb.gamma + 1
            old = self._target.get(k)
            self._target[k] = fb.target_s if old is None else 0.8 * old + 0.2 * fb.target_s

    def target_cost(self, k: int) -> float:
        """An optimistic t_target(k): measured where known; else the dearest measurement at
        fewer tokens (the cost never falls as k grows), or 0 when none is below (so the
        smallest γ gets tried once). Optimism makes an untried γ worth trying only if it
        could beat the measured ones."""
        if k in self._target:
            return self._target[k]
        return max((t for j, t in self._target.items() if j < k), default=0.0)

    def next(self, rows: int = 1) -> int:
        if self._draft_step is None or not self._target:
            return self.gamma
        a = self.alpha
        rates = {
            g: expected_tokens(a, g) / (g * self._draft_step + self.target_cost(g + 1))
            for g in range(1, self.gamma_max + 1)
        }
        self.gamma = max(rates, key=rates.get)
        return self.gamma


@dataclass
class BackoffGamma(GammaPolicy):
    """`inner`'s γ while speculation pays, else γ = 0: target-only steps.

    It counts per-token acceptance like `AnalyticGamma` (accepted, plus the first rejection
    of a pass, with old passes decayed). Once it has judged `min_evidence` tokens, after
    each speculative pass it asks whether the best fixed γ at that α̂ beats target-only
    decoding by `margin` under the stored `cost`. If not, the next `probe_after` steps are
    target-only, then one speculative pass probes again; each failed probe doubles the
    wait (up to `probe_max`), a probe that pays resumes speculation and resets it. Counts
    only: the same audio gives the same γ sequence, so seeded sampling stays reproducible.

    A batch counts every row's tokens (each row keeps what it accepted, so the pooled α̂ is
    the typical row's), and a pass over B > 1 rows is judged, and its γ capped at the best
    fixed γ, under the cost curve measured for that batch size (`batch`, `batch_cost`): at
    B = 8 on a CPU that caps γ well below the one-row choice. Counting the least-accepting
    row instead made held-out chunked decoding target-only for most steps.

    untrained: the draft was not trained on this decode's language (a distilled draft's
    recipe names its languages). Then it starts target-only for `untrained_wait` steps
    (default `probe_max`), with a prior of α = 0 worth `untrained_prior` tokens, and lets
    the probes show otherwise.

    A cost curve under which even a draft that is always right could not win (`can_pay`: a
    CPU whose draft step costs nearly a target pass) makes the passes at that size target-only
    from the start, without the probes."""

    inner: GammaPolicy
    cost: SpeculationCost
    batch: dict[int, SpeculationCost] = field(default_factory=dict)  # B -> cost (empty: `cost`)
    batch_prior: float = 0.8  # α for a batch's γ before anything is counted (a trained language's)
    margin: float = 1.0  # speculation must be expected to be at least this much faster
    # judged tokens before the first decision: a false fallback on a draft trained
    # for the language costs more than a late true one, so it waits for a few passes
    min_evidence: float = 10.0
    untrained_prior: float = 4.0  # untrained: α = 0 worth this many judged tokens
    # untrained: target-only steps before the first probe (None: probe_max). A probe the
    # draft fails costs about one target step, so short windows should not pay for two
    untrained_wait: int | None = None
    probe_after: int = 16  # target-only steps before the first probe
    probe_max: int = 64  # the longest wait between probes
    decay: float = 0.9  # per pass, on the counts
    untrained: bool = False
    _acc: float = field(default=0.0, repr=False)
    _tries: float = field(default=0.0, repr=False)
    _seen: int = field(default=0, repr=False)  # judged tokens, undecayed
    _off: int = field(default=0, repr=False)  # target-only steps left before the next probe
    _wait: int = field(default=0, repr=False)  # the wait after the next failed decision
    _rows: int = field(default=1, repr=False)  # rows of the pass asked for last
    fallbacks: int = 0  # times it switched to target-only steps

    def __post_init__(self) -> None:
        if self.untrained:
            first = self.probe_max if self.untrained_wait is None else self.untrained_wait
            self._tries, self._off = self.untrained_prior, first
            self._wait = min(2 * first, self.probe_max)  # as after one failed decision

    @property
    def alpha(self) -> float:
        return min(0.999, self._acc / self._tries) if self._tries else 1.0

    @property
    def cost_now(self) -> SpeculationCost:
        """The cost curve for the batch size of the last `next`."""
        return batch_cost(self._rows, self.cost, self.batch)

    def pays(self) -> bool:
        if not self.untrained and self._seen < self.min_evidence:
            return True
        cost = self.cost_now
        return best_speedup(self.alpha, cost.c, cost.verify)[0] >= self.margin

    def next(self, rows: int = 1) -> int:
        self._rows = rows
        if not self.cost_now.can_pay(self.margin):  # a curve under which no draft could pay
            return 0
        if self._off > 0:
            self._off -= 1
            return 0
        gamma = self.inner.next(rows)
        if rows > 1 and self.batch:  # a batch: no longer than the best γ for its cost curve
            cost, alpha = self.cost_now, self.alpha if self._tries else self.batch_prior
            gamma = min(gamma, max(1, best_speedup(alpha, cost.c, cost.verify)[1]))
        return gamma

    def observe(self, fb: Feedback) -> None:
        self.inner.observe(fb)
        hits = sum(fb.rows)
        judged = hits + sum(n < fb.gamma for n in fb.rows)  # each row's first rejection, if any
        self._acc = self.decay * self._acc + hits
        self._tries = self.decay * self._tries + judged
        self._seen += judged
        if self.pays():
            self._wait = self.probe_after
            return
        self._wait = max(self._wait, self.probe_after)
        self._off = self._wait
        self._wait = min(2 * self._wait, self.probe_max)
        self.fallbacks += 1


def backs_off(name: str, device: str) -> bool:
    """Whether the γ policy `name` on `device` is the backoff policy (judged by cost curves)."""
    return name == "backoff" or (name == "auto" and device == "cpu")


def make_policy(
    name: str,
    gamma: int,
    gamma_max: int,
    device: str = "cpu",
    cost: SpeculationCost | None = None,
    untrained: bool = False,
    int8_target: bool = False,
    batch: dict[int, SpeculationCost] | None = None,
) -> GammaPolicy:
    """`auto` is fixed with backoff on CPU, where verifying k tokens costs more with every k
    (so long drafts that are all accepted are not worth growing, and a draft that agrees
    too rarely makes decoding slower than the target alone), and adaptive on accelerators,
    where a pass over 2–20 tokens costs about one step. `backoff` is fixed with backoff on
    any device. Fixed, adaptive and backoff are deterministic, so seeded sampling repeats
    exactly; analytic is not (its γ follows measured times). cost: the stored cost curve
    for backoff at one row (default `CPU_COST`, or `CPU_COST_INT8` for an int8 target on a
    CPU; on a CPU batches use `CPU_BATCH_COSTS`, or `CPU_BATCH_COSTS_INT8` for an int8
    target: `int8_target`); batch: curves for B > 1 rows measured on this machine
    (`specasr.decode.calibration`) in place of those tables; untrained: the draft never saw
    the decode's language (backoff starts target-only)."""
    if name == "auto":
        name = "backoff" if backs_off(name, device) else "adaptive"
    if name == "backoff":
        if batch is None:
            batch = cpu_batch_costs(int8_target) if device == "cpu" else {}
        single = cost or (CPU_COST_INT8 if int8_target and device == "cpu" else CPU_COST)
        return BackoffGamma(FixedGamma(gamma), single, batch, untrained=untrained)
    if name == "fixed":
        return FixedGamma(gamma)
    if name == "adaptive":
        return AdaptiveGamma(gamma, gamma_max)
    if name == "analytic":
        return AnalyticGamma(gamma, gamma_max)
    raise ValueError(f"unknown gamma policy {name!r}")
