"""Speculation cost curves measured on the machine that decodes, once, then read from the cache.

The backoff γ policy (`gamma.BackoffGamma`) decides whether speculation pays from c (draft step
÷ target step) and v(k) (target pass over k tokens ÷ pass over one), at one row and at batches of
rows. Both depend on the CPU (its vector units, caches and cores), on the threads the process
uses, on torch and on the models' shapes and forms, so a curve measured on one machine misjudges
another: the built-in tables (`gamma.CPU_COST` …), measured on one CPU, would make an AVX2 laptop
speculate where it loses, or a large workstation back off where it gains.

So on a CPU the first speculative decode with the backoff policy measures the pair's passes at
the batch sizes it needs (`measure`; its cost is in docs/benchmarks.md) and stores the curves in the cache
(`calibration/<key>.json`, keyed by `calibration_key`: CPU model, features, threads, torch, the
models' shapes and forms); every later process reads them. `specasr calibrate` measures again
and prints them. SPECASR_CALIBRATE chooses: "auto" (default: measure when none is stored),
"cached" (read what is stored, never measure) or "off" (the stored tables only). The built-in
tables stay the fallback wherever no curve is measured. The policy stays deterministic given the
cache: the curves are read once per process, never timed inside the loop.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specasr.cache import default_cache_root, store
from specasr.decode.gamma import SpeculationCost, make_policy, monotone, stored_cost

VERSION = 1  # of the measurement and the file; a new one measures afresh
ROWS = (1, 2, 4, 8)  # batch sizes measured: one row (sequential), and the chunked strategy's batches
MAX_K = 8  # target passes over 1 … MAX_K tokens (γ up to 7)
REPEATS = 4  # timed rounds, each taking every pass once; the least time of each pass counts
MODES = ("auto", "cached", "off")
# CPU flags that change which kernels torch, fbgemm and the fused C step run
FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "asimddp",
    "sve",
    "i8mm",
    "bf16",
)


@dataclass(frozen=True)
class Costs:
    """A pair's cost curves: `single` at one row, `batch` at B > 1 rows (`gamma.batch_cost`)."""

    single: SpeculationCost
    batch: dict[int, SpeculationCost]

    @classmethod
    def of(cls, sizes: dict[int, SpeculationCost]) -> Costs:
        """From curves per batch size (1 among them)."""
        return cls(sizes[1], {b: c for b, c in sizes.items() if b > 1})


def needed(rows: int) -> tuple[int, ...]:
    """The measured sizes a pass over `rows` rows (or fewer, as rows finish) is judged by."""
    return tuple(b for b in ROWS if b <= max(1, rows))


def mode() -> str:
    """SPECASR_CALIBRATE: auto (default), cached or off."""
    value = os.environ.get("SPECASR_CALIBRATE", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"SPECASR_CALIBRATE={value!r}: expected one of {', '.join(MODES)}")
    return value


@functools.cache
def cpu() -> dict:
    """This CPU as the curves depend on it: its model name and the flags that pick kernels
    (read once: every decode's key asks, and /proc/cpuinfo grows with the cores)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        field, _, value = line.partition(":")
        field = field.strip().lower()
        if field in ("model name", "cpu model", "hardware") and value.strip():
            name = value.strip()
        elif field in ("flags", "features"):
            flags |= set(value.split())
    return {"model": name, "machine": platform.machine(), "flags": sorted(flags.intersection(FLAGS))}


def calibration_key(pair) -> dict:
    """What a measured curve holds for: this CPU, the threads torch uses now, torch, and the
    pair's shapes and forms (its weights' values do not change the costs)."""
    import torch

    def shape(model) -> dict:
        config = getattr(model, "config", None)
        if config is not None:  # a Whisper model
            dims = [config.d_model, config.decoder_layers, config.decoder_ffn_dim, config.vocab_size]
        else:  # a distilled draft: its own layers over its own vocabulary rows
            vocab = getattr(model, "vocab_ids", None)
            dims = [
                model.d_model,
                len(model.layers),
                model.ffn,
                model.vocab_size if vocab is None else len(vocab),
            ]
            dims.append(getattr(model, "cross_pool", 1))
        return {"class": type(model).__name__, "dims": dims}

    from specasr.runtime.runner import decoder_form

    draft = pair.draft
    return {
        "version": VERSION,
        "cpu": cpu(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "compute_type": getattr(pair, "compute_type", "float32"),
        "dtype": str(pair.dtype),
        "target": shape(pair.target) | {"form": decoder_form(pair.target).describe()},
        "draft": shape(draft)
        | {
            "form": decoder_form(draft).describe(),
            "name": getattr(pair, "draft_name", None),  # says int8 where its products are
            "fused": getattr(draft, "fused", None) is not None,
        },
    }


def cache_path(key: dict, root: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return (root or default_cache_root()) / "calibration" / f"{digest}.json"


def read(key: dict, root: Path | None = None) -> dict[int, SpeculationCost]:
    """The curves stored for `key`, per batch size ({} when none are, or the file does not
    hold them)."""
    try:
        data = json.loads(cache_path(key, root).read_text())
        if data.get("key") != key:  # a digest collision, or a hand-edited file
            return {}
        return {
            int(b): SpeculationCost(float(d["c"]), {int(k): float(v) for k, v in d["verify"].items()})
            for b, d in data["sizes"].items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def write(key: dict, sizes: dict[int, SpeculationCost], root: Path | None = None) -> Path:
    """Stores the curves for `key` (whole: a reader never sees half a file)."""
    path = cache_path(key, root)
    data = {
        "key": key,
        "sizes": {
            str(b): {"c": c.c, "verify": {str(k): v for k, v in sorted(c.verify.items())}}
            for b, c in sorted(sizes.items())
        },
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    store(path, (json.dumps(data, indent=1) + "\n").encode())
    return path


def _v(cost: SpeculationCost | None, k: int) -> str:
    if cost is None or k not in cost.verify:
        return "–"
    return f"{cost.verify[k]:.2f}"


def cost_table(
    measured: dict[int, SpeculationCost], stored: dict[int, SpeculationCost], ks: list[int]
) -> str:
    """One row per batch size: the measured c and v(k), then the stored ones (– where none is)."""
    head = (
        "| rows | c | "
        + " | ".join(f"v({k})" for k in ks)
        + " | stored c | "
        + " | ".join(f"stored v({k})" for k in ks)
        + " |\n"
        + "|---" * (2 * len(ks) + 3)
        + "|"
    )
    body = []
    for rows, cost in measured.items():
        old = stored.get(rows)
        body.append(
            f"| {rows} | {cost.c:.3f} | "
            + " | ".join(_v(cost, k) for k in ks)
            + f" | {'–' if old is None else f'{old.c:.3f}'} | "
            + " | ".join(_v(old, k) for k in ks)
            + " |"
        )
    return "\n".join([head, *body])


def pass_times(
    runners: dict, prefix, new, ks, repeats: int, reduced: tuple[str, ...] = (), pick=statistics.median
) -> dict:
    """Seconds of one pass per runner and k (`pick` of the timed passes: the median, or the
    least where other work on the machine should not count): runners[name](new[:, :k], k) after `prefix`,
    rolled back after each; names in `reduced` pass `reduced=True` (a distilled draft's step over
    its own vocabulary, as the loop takes it) and run k = 1 only. The passes run round-robin,
    every (runner, k) once per round, so a slow spell of a noisy machine lands on all of them
    instead of bending a curve. prefix [B, P], new [B, ≥ max(ks)] token ids."""
    for runner in runners.values():  # each runner's first pass builds what later passes reuse
        runner(prefix, 1)
    times = {(name, k): [] for name in runners for k in ((1,) if name in reduced else ks)}
    for _ in range(repeats):
        for (name, k), taken in times.items():
            runner = runners[name]
            extra = {"reduced": True} if name in reduced and getattr(runner, "vocab", None) else {}
            t0 = time.perf_counter()
            runner(new[:, :k], k, **extra)
            taken.append(time.perf_counter() - t0)
            runner.rollback(prefix.shape[1])
    out: dict = {name: {} for name in runners}
    for (name, k), taken in times.items():
        out[name][k] = pick(taken)
    return out


def measure(pair, rows=ROWS, max_k: int = MAX_K, repeats: int = REPEATS) -> dict[int, SpeculationCost]:
    """Times the pair's draft step and the target's passes over 1 … max_k tokens at each batch
    size in `rows`, on random encoder states (the costs do not depend on the values). Batches
    share one pair of runners made at the largest size and compacted down to each smaller one
    (`keep`), so their cross-attention K/V are computed once; one row gets runners of its own,
    as a sequential decode does (a distilled draft's fused one-token step binds to one row at
    the start). Each time is the least of `repeats` round-robin passes: another process's work
    lands on some passes, never on all."""
    import torch

    from specasr.decode.runners import make_runner

    tok = pair.tokenizer
    ks = tuple(range(1, max_k + 1))
    text = tok.encode(" one two three four five six seven eight nine ten eleven twelve")[:max_k]
    sizes = sorted(set(rows), reverse=True)
    gen = torch.Generator().manual_seed(0)
    curves = {}
    with torch.inference_mode():
        d = pair.target.config.d_model
        states = torch.randn(sizes[0], 1500, d, generator=gen).to(pair.device, pair.dtype)  # [B, 1500, d]
        draft_states = states
        if not pair.shared_encoder:
            d_draft = pair.draft.config.d_model
            draft_states = torch.randn(sizes[0], 1500, d_draft, generator=gen).to(pair.device, pair.dtype)

        def runners(b: int) -> dict:
            mine = states[:b]  # [b, 1500, d]: the draft shares the target's cross K/V on these
            target = make_runner(pair.target, mine, private=True)
            return {
                "target": target,
                "draft": make_runner(pair.draft, mine if pair.shared_encoder else draft_states[:b], target),
            }

        pairs = None
        for b in sizes:
            if b == 1:
                pairs = runners(1)
            elif pairs is None:
                pairs = runners(b)
            else:
                for runner in pairs.values():
                    runner.keep(list(range(b)))
            prefix = torch.tensor([tok.sot_sequence("en", "transcribe", False)] * b, device=pair.device)
            new = torch.tensor([text] * b, device=pair.device)  # [b, max_k]
            t = pass_times(pairs, prefix, new, ks, repeats, reduced=("draft",), pick=min)
            one = t["target"][1]
            curves[b] = SpeculationCost(
                t["draft"][1] / one, monotone({k: s / one for k, s in t["target"].items()})
            )
    return dict(sorted(curves.items()))


def stored_tables(pair) -> dict[int, SpeculationCost]:
    """The curves the backoff policy falls back to for this pair, by batch size: at one row a
    draft's own stored curve or the built-in one, the built-in batch tables above; as
    `gamma.make_policy` picks them when nothing is measured."""
    from specasr.constants import int8_decoder

    int8 = int8_decoder(getattr(pair, "compute_type", "float32"))
    policy = make_policy("backoff", 1, 1, "cpu", stored_cost(pair), int8_target=int8)
    return {1: policy.cost} | policy.batch


def calibrate(pair, rows=ROWS, repeats: int = REPEATS, root: Path | None = None):
    """Measures the pair's curves at `rows` here and stores them beside those already stored
    for other sizes: (every stored curve by size, the file)."""
    key = calibration_key(pair)
    sizes = read(key, root) | measure(pair, rows, repeats=repeats)
    return sizes, write(key, sizes, root)


_READ: dict[str, dict[int, SpeculationCost]] = {}  # per process: what each key's file holds


def measured_costs(pair, rows: int = 1) -> Costs | None:
    """The curves measured on this machine for passes over up to `rows` rows of this pair
    (read from the cache; under SPECASR_CALIBRATE=auto the sizes missing there are measured
    and stored first), or None: calibration off, no draft, not a CPU, a size neither stored
    nor measurable. Then the stored tables decide, as before calibration."""
    how = mode()
    if how == "off" or getattr(pair, "draft", None) is None or pair.device.type != "cpu":
        return None
    key = calibration_key(pair)
    memo = json.dumps(key, sort_keys=True)
    if memo not in _READ:
        _READ[memo] = read(key)
    want = needed(rows)
    missing = [b for b in want if b not in _READ[memo]]
    if missing and how == "auto":
        print(
            f"specasr: measuring this CPU's speculation costs at {', '.join(map(str, missing))} rows "
            "(once; stored in the cache, `specasr calibrate` redoes it)",
            file=sys.stderr,
        )
        try:
            _READ[memo] = _READ[memo] | measure(pair, missing)
            write(key, _READ[memo])
        except (RuntimeError, OSError) as e:  # an odd runner, a read-only cache: as measured so far
            print(
                f"specasr: calibration incomplete ({e}); stored cost curves where none was measured",
                file=sys.stderr,
            )
    have = _READ[memo]
    if any(b not in have for b in want):
        return None
    return Costs.of({b: have[b] for b in want})
