"""Speculative vs autoregressive for one draft, on short clips and on a long recording.

    python -m benchmarks.speedup --model base --draft default --repeats 5 [--also 4:0 ...]
        [--compute-type int8] [--corpus CORPUS/heldout --source asterisk:en --per-source 16]

One process, one run: (1) each LibriVox fixture as one 30 s window
(`specasr.eval.bench.run_bench`), (2) the long-form fixture
(`benchmarks.longform.long_recording`, the clips twice over with pauses, ~75 s)
through the sequential long-form strategy with timestamps, or with `--corpus` windows of
one source of a corpus split joined into one recording, decoded in its language. Both interleave the
autoregressive and speculative runs and report medians, so machine noise hits both alike.
Long-form "end to end" is wall time from samples to segments (log-Mel, encoder, decoder,
fallbacks); "decoder phase" is the summed decoding-loop time. `--also GAMMA:STOP` adds
speculative configurations to the long-form rounds, each paired with the same
autoregressive runs, for a side-by-side table. The results, stamped with command, machine
and commit, are in docs/benchmarks.md.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace

import click

from benchmarks.longform import corpus_options
from specasr.cli.common import compute_type_option
from specasr.options import DecodeOptions, TranscribeOptions
from specasr.stats import DecodeStats


def _side_by_side(name: str, ar_runs: list, runs: list) -> dict:
    """One speculative configuration against the autoregressive runs it was paired with."""
    stats = DecodeStats()
    for r in runs:
        stats = stats.merge(r[2])
    pairs = list(zip(ar_runs, runs))
    decoder = sorted(a[2].decoder_s / s[2].decoder_s for a, s in pairs)  # one ratio per pair
    wall = sorted(a[0] / s[0] for a, s in pairs)
    return {
        "name": name,
        "paired_decoder": statistics.median(decoder),
        "paired_wall": statistics.median(wall),
        # lowest and highest paired ratio: how far one pair strays on a noisy machine
        "decoder_spread": (decoder[0], decoder[-1]),
        "wall_spread": (wall[0], wall[-1]),
        "token_alpha": stats.token_acceptance,
        "tokens_per_call": stats.tokens_per_target_call,
        "target_calls": stats.target_calls / len(runs),
        "draft_calls": stats.draft_calls / len(runs),
        "identical": all(a[1] == s[1] for a, s in pairs),
    }


def _spread(lo_hi: tuple[float, float]) -> str:
    return f"{lo_hi[0]:.2f}× – {lo_hi[1]:.2f}×"


def side_by_side_table(rows: list[dict]) -> str:
    head = (
        "| configuration | decoder phase (paired) | its lowest – highest | end to end (paired) | α̂ "
        "| tokens per target call | target passes | draft steps | identical |\n" + "|---" * 9 + "|"
    )
    body = [
        f"| {r['name']} | {r['paired_decoder']:.2f}× | {_spread(r['decoder_spread'])} "
        f"| {r['paired_wall']:.2f}× | {r['token_alpha']:.3f} "
        f"| {r['tokens_per_call']:.2f} | {r['target_calls']:.0f} | {r['draft_calls']:.0f} "
        f"| {'yes' if r['identical'] else 'no'} |"
        for r in rows
    ]
    return "\n".join([head, *body])


def _long_form(
    pair, samples, options: TranscribeOptions, repeats: int, others: dict | None = None, name: str = "main"
) -> dict:
    """others: name -> TranscribeOptions of more speculative configurations, run in the same
    rounds (after the autoregressive and the main run, called `name`) and paired with the
    same autoregressive runs."""
    from specasr.constants import SAMPLE_RATE
    from specasr.transcription import transcribe

    ar_opts = options.with_decode(mode="autoregressive")

    def run(opts):
        t0 = time.perf_counter()
        segments, info = transcribe(samples, pair, opts, source_rate=SAMPLE_RATE)
        segments = list(segments)
        return time.perf_counter() - t0, [s.tokens for s in segments], info.stats

    others = others or {}
    run(ar_opts), run(options)  # warm-up
    rows = {"ar": [], "spec": []}
    extra = {name: [] for name in others}
    spec_stats = DecodeStats()
    for _ in range(repeats):
        ar, sp = run(ar_opts), run(options)
        rows["ar"].append(ar)
        rows["spec"].append(sp)
        spec_stats = spec_stats.merge(sp[2])
        for other, opts in others.items():
            extra[other].append(run(opts))
    med = {k: statistics.median(r[0] for r in v) for k, v in rows.items()}
    paired = _side_by_side(name, rows["ar"], rows["spec"])  # run i of each, back to back: drift cancels
    dec = {k: statistics.median(r[2].decoder_s for r in v) for k, v in rows.items()}
    ar_step = statistics.median(r[2].target_s / r[2].target_calls for r in rows["ar"])
    draft_step = spec_stats.draft_s / max(1, spec_stats.draft_calls)
    return {
        "seconds": len(samples) / SAMPLE_RATE,
        "ar_wall": med["ar"],
        "spec_wall": med["spec"],
        "paired_wall": paired["paired_wall"],
        "paired_decoder": paired["paired_decoder"],
        "decoder_spread": paired["decoder_spread"],
        "wall_spread": paired["wall_spread"],
        "ar_decoder": dec["ar"],
        "ar_window": statistics.median(r[2].window_s for r in rows["ar"]),
        "spec_decoder": dec["spec"],
        "alpha": spec_stats.acceptance_rate,
        "token_alpha": spec_stats.token_acceptance,
        "tokens_per_call": spec_stats.tokens_per_target_call,
        "c": draft_step / ar_step,
        "mean_gamma": sum(spec_stats.gammas) / max(1, len(spec_stats.gammas)),
        "stopped": spec_stats.draft_stops / max(1, len(spec_stats.gammas)),
        "identical": paired["identical"],
        "side_by_side": [paired] + [_side_by_side(other, rows["ar"], runs) for other, runs in extra.items()],
    }


@dataclass
class StepCosts:
    """Median ms of one pass: the target over k new tokens, per k (what decoding uses, and
    the Hugging Face module it replaces on CPU), and one draft step."""

    target: dict[int, float]
    eager: dict[int, float] = field(default_factory=dict)  # the model's own layers, no CPU forms
    draft: float | None = None

    def verify_curve(self) -> dict[int, float]:
        """v(k) = pass over k tokens ÷ pass over 1: the curve the theory assumes flat."""
        return {k: ms / self.target[1] for k, ms in self.target.items()}

    def table(self) -> str:
        rows = [(f"target k={k}", ms) for k, ms in self.target.items()]
        rows += [(f"target k={k}, eager layers", ms) for k, ms in self.eager.items()]
        rows += [] if self.draft is None else [("draft step", self.draft)]
        return "| pass | ms |\n|---|---|\n" + "\n".join(f"| {k} | {v:.1f} |" for k, v in rows)


def step_costs(pair, mel, ks=tuple(range(1, 9)), repeats: int = 20, eager: bool = True) -> StepCosts:
    """Times one target pass over k new tokens (decoder + output projection) for each k, and
    one draft step, over every row of mel [B, 80, 3000] (B uniform rows: a batch of windows).
    eager: also the model's own layers, where the CPU forms replace them. The passes run
    round-robin, every k (and the draft step) once per round, so a slow spell of a noisy
    machine lands on all of them instead of bending the curve v(k)."""
    import torch

    from specasr.decode.calibration import pass_times
    from specasr.decode.runners import make_runner
    from specasr.runtime.runner import LeanDecoder, LeanRunner

    target_states, draft_states = pair.encode(mel)
    rows = mel.shape[0]
    prefix = torch.tensor([pair.tokenizer.sot_sequence("en", "transcribe", False)] * rows, device=pair.device)
    new = torch.tensor([pair.tokenizer.encode(" one two three four five six seven eight nine")[:8]] * rows)
    new = new.to(pair.device)

    runners = {"target": make_runner(pair.target, target_states)}
    if eager and LeanDecoder.supports(pair.target):  # the eager layers the CPU forms replace, for comparison
        runners["eager"] = LeanRunner(pair.target.model.decoder, target_states)
    if pair.draft is not None:
        runners["draft"] = make_runner(pair.draft, draft_states)
    seconds = pass_times(runners, prefix, new, ks, repeats, reduced=("draft",))

    def median_ms(name: str) -> dict[int, float]:
        return {k: 1e3 * s for k, s in seconds.get(name, {}).items()}

    costs = StepCosts(median_ms("target"), eager=median_ms("eager"))
    if "draft" in runners:
        costs.draft = median_ms("draft")[1]
    return costs


def _or_unreachable(x: float | None) -> str:
    return "unreachable" if x is None else f"{x:.3f}"


@dataclass(frozen=True)
class Bounds:
    """What decoding could reach at the measured α̂, c and verification curve v(k), and what
    a decoder-phase `goal` and an end-to-end `e2e_goal` would take (see `bounds`)."""

    verify: dict[int, float]  # v(k) = pass over k tokens ÷ pass over 1
    goal: float  # decoder-phase speedup asked for
    e2e_goal: float  # end-to-end speedup asked for
    loop: float  # best fixed-γ loop speedup at α̂, c and v (gamma.best_speedup)
    loop_gamma: int  # the γ that reaches it
    window_s: float  # F: per-window work of the autoregressive decoder phase, seconds
    decoder_s: float  # D: the autoregressive decoder phase, seconds
    phase: float  # best fixed-γ decoder-phase speedup: D / (F + (D − F) / loop)
    end_to_end: float  # best fixed-γ end-to-end speedup: W / (W − D + D / phase)
    need_alpha: float | None  # α̂ that `goal` needs at this c and v; None: unreachable
    need_c: float | None  # c that `goal` needs at this α̂ and v; None: unreachable
    need_alpha_e2e: float | None  # α̂ that `e2e_goal` needs at this c and v; None: unreachable

    @property
    def window_share(self) -> float:
        """F / D: the share of the decoder phase that speculation does not shorten."""
        return self.window_s / self.decoder_s


def bounds(lf: dict, verify: dict[int, float], goal: float, e2e_goal: float) -> Bounds:
    """What decoding could reach at the measured α̂, c and verification curve v(k), and what
    a decoder-phase `goal` and an end-to-end `e2e_goal` would take. The loop's best is
    gamma.best_speedup (no overhead), for drafts that always run to γ: the confidence stop
    (DecodeOptions.draft_stop) chooses each run's length and can go past it. The decoder
    phase adds back the per-window work both modes do alike (runner set-up with the cross
    K/V, the first pass over the prompt), measured in the autoregressive runs:
    D / (F + (D − F) / loop best). End to end adds the log-Mel and encoder time, which
    speculation does not change.

    lf: `_long_form`'s measurements (ar_decoder D, ar_window F, ar_wall W, token_alpha, c)."""

    from specasr.decode.gamma import best_speedup, crossing

    D, F, W = lf["ar_decoder"], lf["ar_window"], lf["ar_wall"]

    def phase(alpha: float, c: float) -> float:
        return D / (F + (D - F) / best_speedup(alpha, c, verify)[0])

    def end_to_end(alpha: float, c: float) -> float:  # log-Mel and encoder unchanged
        return W / (W - D + D / phase(alpha, c))

    alpha, c = lf["token_alpha"], lf["c"]
    loop, g = best_speedup(alpha, c, verify)
    return Bounds(
        verify=dict(verify),
        goal=goal,
        e2e_goal=e2e_goal,
        loop=loop,
        loop_gamma=g,
        window_s=F,
        decoder_s=D,
        phase=phase(alpha, c),
        end_to_end=end_to_end(alpha, c),
        need_alpha=crossing(goal, lambda a: phase(a, c), 0.0, 0.999),
        need_c=crossing(goal, lambda x: phase(alpha, x), 0.0, 1.0),
        need_alpha_e2e=crossing(e2e_goal, lambda a: end_to_end(a, c), 0.0, 0.999),
    )


def _bound_rows(b: Bounds) -> list[tuple[str, str]]:
    """`bounds` as (label, value) rows of the long-form table."""
    curve = ", ".join(f"{k}: {v:.2f}" for k, v in sorted(b.verify.items()))
    goal, e2e_goal = b.goal, b.e2e_goal
    return [
        ("verification cost v(k) = pass over k tokens ÷ pass over 1", curve),
        (
            "best fixed-γ loop speedup at this α̂, c and v (gamma.best_speedup)",
            f"{b.loop:.2f}× at γ = {b.loop_gamma}",
        ),
        (
            "per-window share of the autoregressive decoder phase",
            f"{b.window_share:.2f} ({b.window_s:.2f} of {b.decoder_s:.2f} s)",
        ),
        ("best fixed-γ decoder-phase speedup at this α̂, c and v", f"{b.phase:.2f}×"),
        (f"α̂ for {goal}× decoder phase at this c and v", _or_unreachable(b.need_alpha)),
        (f"c for {goal}× decoder phase at this α̂ and v", _or_unreachable(b.need_c)),
        ("best fixed-γ end-to-end speedup at this α̂, c and v", f"{b.end_to_end:.2f}×"),
        (f"α̂ for {e2e_goal}× end to end at this c and v", _or_unreachable(b.need_alpha_e2e)),
    ]


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--mode", default="exact", show_default=True)
@click.option("--gamma", type=int, default=DecodeOptions.gamma, show_default=True)
@click.option("--gamma-policy", default=DecodeOptions.gamma_policy, show_default=True)
@click.option("--draft-stop", type=float, default=DecodeOptions.draft_stop, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option(
    "--data", type=click.Path(exists=True, file_okay=False), default="tests/data", show_default=True
)
@click.option(
    "--also",
    multiple=True,
    help="Another speculative configuration GAMMA:STOP (e.g. 4:0) for the long-form side-by-side table.",
)
@click.option("--device", default="cpu", show_default=True)
@compute_type_option(
    "The target's compute type (`load_pair(compute_type=)`); both sides decode the same target."
)
@corpus_options  # the long-form part's recording
def main(
    model,
    draft,
    mode,
    gamma,
    gamma_policy,
    draft_stop,
    repeats,
    data,
    also,
    device,
    compute_type,
    corpus,
    source,
    per_source,
) -> None:
    from pathlib import Path

    import torch

    from benchmarks.longform import recording
    from specasr.eval.bench import file_mels, run_bench
    from specasr.models.loading import load_pair

    # the long-form recording first: a corpus without that source fails before any model work
    long_form, language = recording(data, corpus, source, per_source)
    pair = load_pair(model, draft, device=device, compute_type=compute_type)
    click.echo(
        f"{model} [{pair.compute_type}] + draft {pair.draft_name}, mode {mode}, "
        f"γ {gamma_policy} from {gamma}, draft stop {draft_stop}, "
        f"device {pair.device}, {torch.get_num_threads()} threads, {repeats} repeats, T = 0\n"
    )
    files = sorted(Path(data).glob("*.wav"))
    opts = DecodeOptions(
        mode=mode, gamma=gamma, gamma_policy=gamma_policy, draft_stop=draft_stop, timing=True
    )
    report = run_bench(pair, file_mels(pair, files), opts, repeats=repeats)
    click.echo(f"### {len(files)} LibriVox clips, one window each\n\n{report.table()}\n")
    costs = step_costs(pair, file_mels(pair, files[:1])[0])
    click.echo(f"### Step costs (median ms)\n\n{costs.table()}\n")
    base = TranscribeOptions()
    lf_decode = replace(opts, timestamps=True, max_new_tokens=base.decode.max_new_tokens, language=language)
    lf_opts = replace(base, decode=lf_decode)
    others = {}
    for spec in also:
        g, _, stop = spec.partition(":")
        try:
            others[f"γ {g}, stop {float(stop or 0):g}"] = lf_opts.with_decode(
                gamma=int(g),
                gamma_max=max(lf_opts.decode.gamma_max, int(g)),
                draft_stop=float(stop or 0),
            )
        except ValueError as e:
            raise click.BadParameter(f"{spec!r}: {e}", param_hint="--also") from e
    name = f"γ {gamma} ({gamma_policy}), stop {draft_stop:g}"
    lf = _long_form(pair, long_form.samples, lf_opts, repeats, others, name)
    rows = [
        ("audio", f"{lf['seconds']:.1f} s"),
        ("end to end, autoregressive (median, s)", f"{lf['ar_wall']:.2f}"),
        ("end to end, speculative (median, s)", f"{lf['spec_wall']:.2f}"),
        ("end-to-end speedup", f"{lf['ar_wall'] / lf['spec_wall']:.2f}×"),
        ("decoder-phase speedup", f"{lf['ar_decoder'] / lf['spec_decoder']:.2f}×"),
        ("end-to-end speedup, median of paired runs", f"{lf['paired_wall']:.2f}×"),
        ("decoder-phase speedup, median of paired runs", f"{lf['paired_decoder']:.2f}×"),
        ("paired runs, lowest – highest: end to end", _spread(lf["wall_spread"])),
        ("paired runs, lowest – highest: decoder phase", _spread(lf["decoder_spread"])),
        ("α̂ per token (accepted / (accepted + rejected))", f"{lf['token_alpha']:.3f}"),
        ("accepted / proposed", f"{lf['alpha']:.3f}"),
        ("tokens per target call", f"{lf['tokens_per_call']:.2f}"),
        ("mean γ", f"{lf['mean_gamma']:.2f}"),
        ("share of draft runs ended by the confidence stop", f"{lf['stopped']:.2f}"),
        ("cost ratio c", f"{lf['c']:.3f}"),
        ("tokens identical to autoregressive", "yes" if lf["identical"] else "no"),
    ]
    rows += _bound_rows(bounds(lf, costs.verify_curve(), goal=1.5, e2e_goal=1.2))
    what = "Long-form fixture" if corpus is None else f"{per_source} windows of {source} ({corpus})"
    click.echo(f"### {what}, sequential strategy with timestamps\n")
    click.echo("| metric | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows))
    if others:
        click.echo("\n### Long-form side by side (each paired with the same autoregressive runs)\n")
        click.echo(side_by_side_table(lf["side_by_side"]))


if __name__ == "__main__":
    main()
