"""Choosing γ and the draft-confidence stop (`DecodeOptions.draft_stop`) from data.

    python -m benchmarks.stop_sweep [AUDIO_OR_SHARDS...] [--held-out WORK]
        [--corpus CORPUS/heldout] [--model base --draft default]

Inputs are audio files, label shards of `specasr distill` (work/labels/*.pt), or with
`--held-out` a distill work directory: the windows its training held out (the same split,
`recipes.distill_draft.split_examples`), with the prompts the teacher stage drew, or with
`--corpus` the held-out split of a multilingual corpus (whole prompts, levels and voices
held out, `recipes/speech_corpus.py`), each window in the language its corpus names. A choice
made on windows the draft never trained on is the point: on its training windows a draft
agrees more, and the sweep would favour longer runs than real speech pays for.

1. **Positions.** The target transcribes each 30 s window greedily, with timestamps as in
   long-form decoding (audio: the previous window's text is the prompt; shards: their
   labels, half of them with another window's text as prompt). The draft then runs
   teacher-forced over that transcript: for every position, q of its own greedy pick under
   the filtered draft distribution, and whether the pick is the target's token.
2. **Replay** (`simulate`). A run proposes until γ, or until a proposal has q(d) below the
   threshold (that proposal is still offered); the target accepts the longest correct
   prefix and adds one token; the pass costs γ_used · c + v(γ_used + 1) target steps.
   Tokens per unit cost is the loop speedup over autoregressive decoding (one token per
   step) that the rule would give at this machine's c and v(k), measured here as
   `speedup_bench` measures them.

The replay uses teacher-forced q(d) after a wrong proposal too, where the real loop's draft
would see its own wrong token; those positions are rejected either way, so only the stop
decisions on them are approximate. It counts no per-window cost and no loop overhead.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import click
import torch

from specasr.cli.common import compute_type_option

Position = tuple[float, bool]  # (q of the draft's greedy pick, pick == target's token)


def simulate(
    windows: list[list[Position]], gamma: int, threshold: float, c: float, verify: dict[int, float]
) -> float:
    """Tokens per target-step of cost when replaying the loop over teacher-forced positions
    (see the module docstring); verify[k] = v(k) must cover k = 1 … γ + 1."""
    tokens = cost = 0.0
    for w in windows:
        t, n = 0, len(w)
        while t < n:
            k = 0
            while k < gamma and t + k < n:
                q, _ = w[t + k]
                k += 1
                if q < threshold:
                    break
            accepted = 0
            while accepted < k and w[t + accepted][1]:
                accepted += 1
            emitted = min(accepted + 1, n - t)
            tokens += emitted
            cost += k * c + verify[k + 1]
            t += emitted
    return tokens / cost if cost else 0.0


@torch.inference_mode()
def teacher_forced(pair, states: torch.Tensor, init: list[int], label: list[int], timestamps: bool):
    """Positions of one window: states [1, 1500, d]; init = prompt + start sequence; label =
    the target's greedy tokens after it (eot appended here)."""
    from specasr.decode.filters import apply_filters
    from specasr.decode.runners import make_runner
    from specasr.decode.task import task_filters
    from specasr.options import DecodeOptions

    seq = list(init) + list(label) + [pair.tokenizer.eot]
    n0 = len(init)
    runner = make_runner(pair.draft, states.to(device=pair.device, dtype=pair.dtype))
    logits = runner(torch.tensor([seq[:-1]], device=pair.device), len(seq) - n0)[0].float()  # [n, V]
    filters = task_filters(pair, DecodeOptions(mode="autoregressive", timestamps=timestamps), n0)
    apply_filters(filters, logits, [seq[: n0 + i] for i in range(len(seq) - n0)])  # row i: its own context
    q, pick = torch.softmax(logits, -1).max(-1)  # [n]
    return [(float(a), int(b) == t) for a, b, t in zip(q, pick, seq[n0:])]


def from_shards(pair, paths: list[Path], prompt_share: float = 0.5, seed: int = 0) -> list[list[Position]]:
    from specasr.decode.task import start_sequence
    from specasr.options import DecodeOptions

    rng = random.Random(seed)
    records = [torch.load(p) for p in paths]
    texts = [[t for t in toks if t < pair.tokenizer.eot] for r in records for toks in r["tokens"]]
    out = []
    for rec in records:
        ts = rec["timestamps"]
        for j, label in enumerate(rec["tokens"]):
            prompt = rng.choice(texts)[-rng.randint(8, 120) :] if rng.random() < prompt_share else None
            opts = DecodeOptions(mode="autoregressive", timestamps=ts, language=rec["languages"][j])
            init, _ = start_sequence(pair, opts, rec["languages"][j], prompt or None)
            out.append(teacher_forced(pair, rec["states"][j : j + 1], init, label, ts))
    return out


def from_work(pair, work: Path) -> list[list[Position]]:
    """Positions of the examples a distill run held out of training: `work` holds its
    options.json and teacher.pt (encoder states fp16, examples with their prompts)."""
    import json

    from specasr.recipes.distill_draft import DistillOptions, split_examples

    known = DistillOptions.__dataclass_fields__
    raw = json.loads((work / "options.json").read_text())
    opts = DistillOptions(**{k: tuple(v) if k == "layers" else v for k, v in raw.items() if k in known})
    cached = torch.load(work / "teacher.pt", weights_only=False)
    held, _ = split_examples(cached["examples"], opts)
    no_ts = pair.tokenizer.no_timestamps
    out = []
    for ex in held:
        init, label = ex.seq[: ex.begin], ex.seq[ex.begin : -1]  # seq ends with eot
        states = cached["states"][ex.state : ex.state + 1]  # [1, 1500, d]
        out.append(teacher_forced(pair, states, init, label, no_ts not in init))
    return out


def from_audio(pair, paths: list[Path], language: str = "en", log=print) -> list[list[Position]]:
    """Positions of every 30 s window of every file; an unreadable file is reported and skipped."""
    from specasr.audio import AudioError, load_audio
    from specasr.constants import N_SAMPLES
    from specasr.decode.loop import decode_states
    from specasr.decode.task import start_sequence
    from specasr.features import log_mel_window, pad_or_trim
    from specasr.options import DecodeOptions

    opts = DecodeOptions(mode="autoregressive", timestamps=True, language=language)
    out = []
    for path in paths:
        try:
            audio = torch.as_tensor(load_audio(path))
        except AudioError as e:
            log(f"skipping {path}: {e}")
            continue
        prompt = None
        for i in range(0, len(audio), N_SAMPLES):
            mel = log_mel_window(
                pad_or_trim(audio[i : i + N_SAMPLES])[None], pair.n_mels
            )  # [1, n_mels, 3000]
            states, _ = pair.encode(mel.to(pair.device))
            label = decode_states(pair, states, None, opts, prompt)[0].tokens
            init, _ = start_sequence(pair, opts, language, prompt)
            out.append(teacher_forced(pair, states, init, label, True))
            prompt = [t for t in label if t < pair.tokenizer.eot] or None
    return out


@dataclass(frozen=True)
class Sweep:
    rates: dict[tuple[int, float], float]  # (γ, threshold) -> loop speedup

    def best(self, threshold: float | None = None) -> tuple[float, int, float]:
        """(speedup, γ, threshold) of the best cell; `threshold` restricts to one column."""
        cells = [(r, g, t) for (g, t), r in self.rates.items() if threshold is None or t == threshold]
        return max(cells)

    def table(self) -> str:
        gammas = sorted({g for g, _ in self.rates})
        ths = sorted({t for _, t in self.rates})
        head = "| γ | " + " | ".join(f"stop {t:g}" for t in ths) + " |\n|---|" + "---|" * len(ths)
        rows = [f"| {g} | " + " | ".join(f"{self.rates[g, t]:.3f}" for t in ths) + " |" for g in gammas]
        return "\n".join([head, *rows])


def sweep(windows, gammas, thresholds, c: float, verify: dict[int, float]) -> Sweep:
    return Sweep({(g, t): simulate(windows, g, t, c, verify) for g in gammas for t in thresholds})


@click.command()
@click.argument("inputs", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--held-out",
    "work",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="A `specasr distill` work directory: add the windows its training held out.",
)
@click.option(
    "--corpus",
    "corpora",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A held-out split of `specasr distill corpus --source …`: its windows, each in its language.",
)
@click.option("--per-source", type=int, default=20, show_default=True, help="Windows per --corpus source.")
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--gammas", default="2,3,4,5,6,7", show_default=True)
@click.option("--thresholds", default="0,0.3,0.4,0.5,0.6,0.7,0.8", show_default=True)
@click.option("--c", "c_given", type=float, default=None, help="Draft step ÷ target step (default: measure).")
@click.option(
    "--verify", default=None, help="v(k) as 1:1,2:1.27,… (default: measure, as speedup_bench does)."
)
@click.option("--device", default="cpu", show_default=True)
@compute_type_option(
    "The target's compute type (`load_pair(compute_type=)`): its transcripts and cost curve."
)
def main(
    inputs, work, corpora, per_source, model, draft, gammas, thresholds, c_given, verify, device, compute_type
) -> None:
    """Replays the speculative loop over INPUTS (and --held-out windows) for each γ and stop threshold."""
    from benchmarks.speedup import step_costs
    from specasr.eval.bench import file_mels
    from specasr.models.loading import load_pair

    if not inputs and work is None and not corpora:
        raise click.UsageError("give audio files or label shards, --held-out WORK or --corpus SPLIT")
    missing = [f for f in ("teacher.pt", "options.json") if work is not None and not (work / f).is_file()]
    if missing:
        raise click.BadParameter(
            f"{work} has no {' or '.join(missing)} (run `specasr distill` there)", param_hint="--held-out"
        )
    gs = [int(g) for g in gammas.split(",")]  # checked before any model work
    if max(gs) > 7:
        raise click.BadParameter(
            "γ up to 7: the cost curve is timed for passes of up to 8 tokens", param_hint="--gammas"
        )
    if verify is not None:
        verify = {int(k): float(v) for k, v in (kv.split(":") for kv in verify.split(","))}
        if any(k not in verify for k in range(1, max(gs) + 2)):
            raise click.BadParameter(f"needs v(k) for k = 1 … {max(gs) + 1}", param_hint="--verify")
    pair = load_pair(model, draft, device=device, compute_type=compute_type)
    shards = [p for p in inputs if p.suffix == ".pt"]
    audio = [p for p in inputs if p.suffix != ".pt"]
    windows = (from_shards(pair, shards) if shards else []) + (
        from_audio(pair, audio, log=lambda m: click.echo(m, err=True)) if audio else []
    )
    windows += from_work(pair, work) if work is not None else []
    for split in corpora:
        from benchmarks.languages import corpus_groups

        for lang, files in corpus_groups(split, per_source).values():
            windows += from_audio(pair, files, lang, log=lambda m: click.echo(m, err=True))
    if c_given is None or verify is None:
        # timed on the bundled example: a pass's cost does not depend on what is said
        costs = step_costs(pair, file_mels(pair, [_example()])[0], ks=tuple(range(1, max(gs) + 2)))
    c = costs.draft / costs.target[1] if c_given is None else c_given
    if verify is None:
        verify = costs.verify_curve()
    n = sum(map(len, windows))
    agree = sum(ok for w in windows for _, ok in w) / max(1, n)
    click.echo(
        f"{model} [{pair.compute_type}] + draft {pair.draft_name}: {len(windows)} windows, {n} positions, "
        f"greedy agreement {agree:.3f}; c {c:.3f}, v(k) "
        + ", ".join(f"{k}: {v:.2f}" for k, v in verify.items())
        + "\n"
    )
    result = sweep(windows, gs, [float(t) for t in thresholds.split(",")], c, verify)
    click.echo(result.table())
    rate, g, t = result.best()
    fixed, fg, _ = result.best(threshold=0.0)
    click.echo(f"\nbest: γ {g}, stop {t:g}: {rate:.3f}× (best without a stop: γ {fg}, {fixed:.3f}×)")


def _example() -> str:
    from importlib.resources import files

    return str(files("specasr") / "assets" / "example.wav")


if __name__ == "__main__":
    main()
