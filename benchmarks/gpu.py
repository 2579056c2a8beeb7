"""The decoder phase across loops and batch sizes, for a lent GPU (issue 21).

    python -m benchmarks.gpu --device cuda --batch 1,4,16 --repeats 3 [--hf] [--breakdown]
        [--transcribe] [--faster-whisper]

For each batch size B > 1, the LibriVox clips are stacked (repeated) into B rows and encoded
once; B = 1 decodes every clip in turn.
Then every configuration decodes the same encoder states, interleaved `repeats` times:

- `ar`, `exact`, `sigmoid`: the host loop (`decode.loop.decode_states`);
- `device-ar`, `device-exact`: the device loop (`decode.graphed`; γ = `--gamma`), each
  step one CUDA graph replay on CUDA (captured in the warm-up run, kept for the timed
  ones); on CUDA also `… eager`, the same loop without graphs;
- `device-exact adaptive`: the device loop with the adaptive γ policy (a graph per γ);
- `--hf`: transformers' `generate` on the same encoder outputs, alone and with the packaged
  draft exported as its assistant (`specasr distill export`).

`--breakdown` adds, per batch size, what a pass and a step cost as graph replays (CUDA
events), c, v(k), the per-token α and the bound they set (`breakdown_table`);
`--transcribe` adds `transcribe_clip` (the product's path, log-Mel to text) with and
without the device loop (`transcribe_table`).

A row reports the median decoder-phase seconds, the ratio to `ar`, end to end (the median
encoder time of the B rows plus the decoder phase: HF's rows decode our encoder's states,
so they are charged our encoder's time), tokens per second, α̂ (accepted / proposed), peak
device memory, and whether its tokens equal `ar`'s. Timing synchronises the device around
each whole decode, never inside one. `--faster-whisper` adds
faster-whisper's end-to-end time at B = 1 on its CTranslate2 files: float16 on CUDA, or the
same compute type on a CPU.

It runs on a CPU too (`--device cpu`), which is how the test suite checks it. The GPU
numbers go in docs/benchmarks.md, with the device named.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import click
import torch

from specasr.options import DecodeOptions


@dataclass
class Row:
    name: str
    batch: int
    seconds: float  # median decoder phase
    encode: float  # median encoder seconds of the B rows (same for every loop of a batch)
    tokens: int  # tokens decoded per run (all rows)
    alpha: float | None
    peak_mb: float | None
    same: bool


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak(device: torch.device, reset: bool = False) -> float | None:
    if device.type != "cuda":
        return None
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


def configurations(pair, gamma: int, hf_dir: Path | None, preset: str = "base", gamma_max: int = 8) -> dict:
    """name -> decode(states) -> (tokens per row, accepted, proposed)."""
    from specasr.decode.gamma import AdaptiveGamma
    from specasr.decode.graphed import decode_graphed
    from specasr.decode.loop import decode_states

    opts = DecodeOptions(mode="autoregressive", language="en")

    def host(mode: str):
        def run(states):
            rs = decode_states(pair, states, states, replace(opts, mode=mode, device_loop=False))
            st = rs[0].stats
            return [r.tokens for r in rs], st.accepted, st.proposed

        return run

    def device(g: int, graphs: bool | None = None, width: str = "matched"):
        def run(states):
            options = replace(opts, device_width=width)
            tokens, s = decode_graphed(pair, states, states, options, g, graphs)
            return tokens, s.accepted, s.proposed

        return run

    runs = {"ar": host("autoregressive"), "exact": host("exact"), "sigmoid": host("sigmoid")}
    runs["device-ar"], runs[f"device-exact γ{gamma}"] = device(0), device(gamma)
    # target-only passes over 1 token, not the matched width's γ + 1: AR's own speed
    runs["device-ar natural width"] = device(0, width="natural")
    runs[f"device-exact adaptive γ{gamma}…{gamma_max}"] = lambda states: device(
        AdaptiveGamma(gamma, gamma_max)
    )(states)
    if pair.device.type == "cuda":  # the same loop without its graphs
        runs["device-ar eager"], runs[f"device-exact γ{gamma} eager"] = device(0, False), device(gamma, False)
    if hf_dir is not None:
        runs.update(_hf_runs(pair, hf_dir, preset))
    return runs


def _hf_runs(pair, hf_dir: Path, preset: str) -> dict:
    """transformers' generate on our encoder states: the offline preset's target alone, and
    with the exported draft."""
    from transformers import WhisperForCausalLM, WhisperForConditionalGeneration
    from transformers.modeling_outputs import BaseModelOutput

    from specasr.models.convert import cached_conversion
    from specasr.models.loading import offline_files

    dtype, dev = pair.dtype, pair.device
    target = WhisperForConditionalGeneration.from_pretrained(cached_conversion(offline_files(preset)))
    target = target.to(dev, dtype).eval()
    assistant = WhisperForCausalLM.from_pretrained(hf_dir).to(dev, dtype).eval()
    eot = pair.tokenizer.eot
    kw = {"language": "en", "task": "transcribe", "do_sample": False}

    def run(states, helper=None):
        if helper is not None and states.shape[0] > 1:
            return None  # transformers' assisted generation takes one row at a time
        with torch.inference_mode():
            encoded = BaseModelOutput(last_hidden_state=states)
            extra = {} if helper is None else {"assistant_model": helper}
            out = target.generate(encoder_outputs=encoded, **extra, **kw)
        rows = [[t for t in row if t < eot] for row in out.tolist()]
        return rows, None, None

    return {"hf": lambda s: run(s), "hf-assisted": lambda s: run(s, assistant)}


def _over(run, groups: list[torch.Tensor]):
    """A configuration over every group of rows in turn -> (tokens, accepted, proposed), or None
    where it cannot run that batch."""
    tokens, acc, prop = [], 0, 0
    for states in groups:
        out = run(states)
        if out is None:
            return None
        tokens += out[0]
        acc, prop = (None, None) if out[1] is None or acc is None else (acc + out[1], prop + out[2])
    return tokens, acc, prop


def bench(
    pair,
    mels: torch.Tensor,
    batches: list[int],
    repeats: int,
    gamma: int,
    hf_dir: Path | None,
    preset: str = "base",
    gamma_max: int = 8,
) -> list[Row]:
    """mels [n, n_mels, 3000] -> rows per batch size and configuration. B = 1 decodes every
    clip in turn; B > 1 stacks the clips (repeated) into one batch of B rows."""
    dev, n = pair.device, mels.shape[0]
    runs = configurations(pair, gamma, hf_dir, preset, gamma_max)
    rows = []
    for B in batches:
        index = [[i] for i in range(n)] if B == 1 else [[i % n for i in range(B)]]
        encodes = []
        for _ in range(repeats + 1):
            _sync(dev)
            t = time.perf_counter()
            with torch.inference_mode():
                groups = [pair.encode(mels[i].to(dev))[0] for i in index]  # each [B, 1500, d]
            _sync(dev)
            encodes.append(time.perf_counter() - t)
        encode = statistics.median(encodes[1:])
        out = {}
        for k, run in runs.items():  # warm-up (allocations, kernel selection, graph capture)
            out[k] = _over(run, groups)
        live = {k: run for k, run in runs.items() if out[k] is not None}
        times = {k: [] for k in live}
        peaks = {}
        for _ in range(repeats):
            for k, run in live.items():
                _peak(dev, reset=True)
                _sync(dev)
                t = time.perf_counter()
                out[k] = _over(run, groups)
                _sync(dev)
                times[k].append(time.perf_counter() - t)
                peaks[k] = _peak(dev)
        ref = out["ar"][0]
        for k in live:
            toks, acc, prop = out[k]
            rows.append(
                Row(
                    k,
                    B,
                    statistics.median(times[k]),
                    encode,
                    sum(map(len, toks)),
                    acc / prop if prop else None,
                    peaks[k],
                    toks == ref,
                )
            )
    return rows


def table(rows: list[Row]) -> str:
    ar = {r.batch: r.seconds for r in rows if r.name == "ar"}
    lines = [
        "| B | loop | decoder s | vs ar | e2e s | vs ar | tokens/s | α̂ | peak MB | same tokens as ar |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        alpha = "—" if r.alpha is None else f"{r.alpha:.3f}"
        peak = "—" if r.peak_mb is None else f"{r.peak_mb:.0f}"
        e2e, ar_e2e = r.encode + r.seconds, r.encode + ar[r.batch]
        lines.append(
            f"| {r.batch} | {r.name} | {r.seconds:.4f} | {ar[r.batch] / r.seconds:.2f}× | {e2e:.4f} | "
            f"{ar_e2e / e2e:.2f}× | {r.tokens / r.seconds:.0f} | {alpha} | {peak} | "
            f"{'yes' if r.same else 'NO'} |"
        )
    return "\n".join(lines)


class _Eager:
    """A CPU stand-in for a captured graph: replay calls the function."""

    def __init__(self, fn) -> None:
        self.replay = fn


def _replay_ms(graph, reps: int) -> float:
    """Median milliseconds of one replay of `graph`, by CUDA events over `reps` replays, 5 times
    (on a CPU: `_Eager`, by the wall clock)."""
    runs = []
    for _ in range(5):
        if isinstance(graph, _Eager):
            t = time.perf_counter()
            for _ in range(reps):
                graph.replay()
            runs.append((time.perf_counter() - t) * 1e3 / reps)
            continue
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        runs.append(begin.elapsed_time(end) / reps)
    return statistics.median(runs)


def _graph(fn, device: torch.device):
    """fn captured as a CUDA graph, after two warm-up calls on the capture's side stream (on a
    CPU: `_Eager`)."""
    if device.type != "cuda":
        return _Eager(fn)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        fn()
    return graph


def _graph_ms(fn, device: torch.device, reps: int) -> float:
    """Median milliseconds of one call of fn, captured as a graph (`_graph`) and replayed."""
    return _replay_ms(_graph(fn, device), reps)


def token_alpha(history: list[list[int]], gammas: list[int]) -> float:
    """The per-token acceptance α whose expected accepted count per row and step,
    α(1 − α^γ)/(1 − α), equals the mean over the live rows of fixed-γ steps."""
    from specasr.decode.gamma import crossing, expected_tokens

    counts = [n for rows in history for n in rows if n >= 0]
    g = gammas[0]
    mean = sum(counts) / len(counts)
    a = crossing(mean, lambda x: expected_tokens(x, g) - 1, 0.0, 0.999)
    return 0.999 if a is None else a


@torch.inference_mode()
def pass_costs(
    target_model, draft_model, states: torch.Tensor, reps: int, token: int = 0, widths: int = 9
) -> tuple[dict[int, float], float]:
    """-> ({k: the target's pass over k tokens per row, k = 1 … widths}, the draft's pass over
    one token), in milliseconds: graph replays timed by CUDA events (on a CPU: eager, by the
    wall clock), on `states` [B, 1500, d] (the draft reads them too: a shared encoder)."""
    from specasr.decode.graphed import fixed_pass
    from specasr.decode.runners import make_runner

    B, dev = states.shape[0], states.device
    target = make_runner(target_model, states)
    draft = make_runner(draft_model, states, target)
    tokens = torch.full((B, widths), token, dtype=torch.long, device=dev)
    pos = (20 + torch.arange(widths, device=dev)).expand(B, -1)
    ms = lambda fn: _graph_ms(fn, dev, reps)  # noqa: E731
    t = {k: ms(lambda k=k: fixed_pass(target, tokens[:, :k], pos[:, :k])) for k in range(1, widths + 1)}
    return t, ms(lambda: fixed_pass(draft, tokens[:, :1], pos[:, :1]))


@torch.inference_mode()
def breakdown_table(
    pair, states: torch.Tensor, gamma: int, reps: int | None = None, goal: float = 1.8
) -> str:
    """What one step costs, each as a graph replay timed by CUDA events (on a CPU: eager, by
    the wall clock), and what that bounds. target(k): the target's pass over k tokens;
    draft: one draft token; step: the device loop's whole step (passes, filters,
    acceptance, state update). c = draft ÷ target(1), v(k) = target(k) ÷ target(1), α the
    per-token acceptance of fixed-γ decoding on these rows (`token_alpha`); the bound is
    `gamma.best_speedup` (no per-decode costs)."""
    from specasr.decode.gamma import best_speedup, crossing
    from specasr.decode.graphed import GraphedGreedy
    from specasr.decode.task import Task

    B, dev = states.shape[0], states.device
    reps = reps or (100 if dev.type == "cuda" else 2)
    opts = DecodeOptions(mode="autoregressive", language="en")
    task = Task.build(pair, opts, "en", None)
    t, d = pass_costs(pair.target, pair.draft, states, reps, pair.tokenizer.eot)
    ms = lambda fn: _graph_ms(fn, dev, reps)  # noqa: E731

    steps, alpha = {}, None
    for g in (0, gamma):
        loop = GraphedGreedy(pair, opts, task, g, graphs=False)
        _, st = loop.run(states, states)
        if g:
            alpha = token_alpha(st.history, st.gammas)
        s, tr, dr = loop.start(states, states)  # replays advance these rows: the shapes stay
        steps[g] = ms(lambda s=s, tr=tr, dr=dr, g=g, loop=loop: loop._advance(s, tr, dr, g))
    c, v = d / t[1], {k: t[k] / t[1] for k in t}
    bound, best_g = best_speedup(alpha, c, v)
    need_a = crossing(goal, lambda a: best_speedup(a, c, v)[0], 0.0, 0.999)
    need_c = crossing(goal, lambda x: best_speedup(alpha, x, v)[0], 0.0, 1.0)
    fmt = lambda x: "unreachable" if x is None else f"{x:.3f}"  # noqa: E731
    curve = ", ".join(f"{k}: {x:.2f}" for k, x in v.items())
    return "\n".join(
        [
            f"| B = {B} ({'CUDA graph replays' if dev.type == 'cuda' else 'eager, CPU'}) | |",
            "|---|---|",
            f"| target pass over 1 token | {t[1] * 1e3:.0f} µs |",
            f"| draft pass over 1 token | {d * 1e3:.0f} µs (c = {c:.3f}) |",
            f"| v(k) = target(k) ÷ target(1) | {curve} |",
            f"| device-loop step, autoregressive | {steps[0] * 1e3:.0f} µs |",
            f"| device-loop step, γ = {gamma} | {steps[gamma] * 1e3:.0f} µs "
            f"({steps[gamma] / steps[0]:.2f} AR steps) |",
            f"| per-token α at γ = {gamma} | {alpha:.3f} |",
            f"| best fixed-γ speedup at this α, c, v | {bound:.2f}× at γ = {best_g} |",
            f"| α for {goal}× at this c, v | {fmt(need_a)} |",
            f"| c for {goal}× at this α, v | {fmt(need_c)} |",
        ]
    )


def transcribe_table(pair, files: list[Path], repeats: int) -> str:
    """`transcribe_clip` over the clips one at a time (log-Mel, encoder and decoder), with the
    device loop (`DecodeOptions.device_loop`, CUDA) and without, autoregressive and exact: the
    product's own path, with its defaults (γ policy auto). Median of `repeats` after a warm-up."""
    from specasr.audio import load_audio
    from specasr.transcription import transcribe_clip

    dev = pair.device
    audio = [load_audio(f) for f in files]
    configs = {
        f"{mode} {'device' if loop else 'host'} loop": DecodeOptions(mode=mode, device_loop=loop)
        for mode in ("autoregressive", "exact")
        for loop in (False, True)
    }
    texts, times = {}, {k: [] for k in configs}
    for _ in range(repeats + 1):
        for k, opts in configs.items():
            _sync(dev)
            t = time.perf_counter()
            texts[k] = [transcribe_clip(a, pair, opts, source_rate=16000).text for a in audio]
            _sync(dev)
            times[k].append(time.perf_counter() - t)
    first = next(iter(configs))
    base = statistics.median(times[first][1:])
    lines = [f"| loop | s | vs {first} | same text |", "|---|---|---|---|"]
    for k in configs:
        med = statistics.median(times[k][1:])
        lines.append(
            f"| {k} | {med:.4f} | {base / med:.2f}× | {'yes' if texts[k] == texts[first] else 'NO'} |"
        )
    return "\n".join(lines)


def faster_whisper_row(files: list[Path], device: str, repeats: int, preset: str = "base") -> str:
    """faster-whisper end to end at B = 1 over the clips (greedy, language en), median of repeats."""
    from faster_whisper import WhisperModel

    from benchmarks.whole_process import ct2_dir
    from specasr.audio import load_audio

    compute = "float16" if device == "cuda" else "float32"
    with tempfile.TemporaryDirectory(prefix="specasr-ct2-") as tmp:  # CTranslate2 reads it at load
        model = WhisperModel(str(ct2_dir(Path(tmp), preset)), device=device, compute_type=compute)
    audio = [load_audio(f) for f in files]
    times = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        for a in audio:
            list(model.transcribe(a, beam_size=1, best_of=1, language="en")[0])
        times.append(time.perf_counter() - t)
    median = statistics.median(times[1:])
    return f"faster-whisper {compute} on {device}, end to end, {len(files)} clips at B = 1: {median:.3f} s"


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--device", default="cuda", show_default=True)
@click.option("--batch", "batches", default="1,4,16", show_default=True, help="Comma-separated batch sizes.")
@click.option("--gamma", type=int, default=5, show_default=True, help="γ of the device loop.")
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option(
    "--clips", type=int, default=5, show_default=True, help="LibriVox clips used (stacked into B rows)."
)
@click.option(
    "--data", type=click.Path(exists=True, file_okay=False), default="tests/data", show_default=True
)
@click.option("--hf", "with_hf", is_flag=True, help="Add transformers' generate, alone and assisted.")
@click.option("--faster-whisper", "with_fw", is_flag=True, help="Add faster-whisper end to end at B = 1.")
@click.option("--gamma-max", type=int, default=8, show_default=True, help="The adaptive device loop's γ cap.")
@click.option(
    "--breakdown", is_flag=True, help="Per-pass costs (CUDA: graph replays), c, v(k) and the bound."
)
@click.option(
    "--transcribe",
    "with_transcribe",
    is_flag=True,
    help="Add transcribe_clip with and without the device loop.",
)
def main(
    model,
    draft,
    device,
    batches,
    gamma,
    repeats,
    clips,
    data,
    with_hf,
    with_fw,
    gamma_max,
    breakdown,
    with_transcribe,
) -> None:
    from specasr.eval.bench import file_mels
    from specasr.models.loading import draft_path, load_pair
    from specasr.models.presets import PRESETS

    files = sorted(Path(data).glob("*.wav"))[:clips]
    if not files:
        raise click.UsageError(f"no .wav clips in {data}")
    draft_file = draft_path(PRESETS[model].draft if draft == "default" and model in PRESETS else draft)
    offline = model in PRESETS and PRESETS[model].offline
    if with_hf and (draft_file is None or not offline):
        raise click.UsageError("--hf needs an offline preset target (base, tiny.en) and a distilled draft")
    if with_fw and not offline:
        raise click.UsageError("--faster-whisper needs an offline preset target (base, tiny.en)")
    pair = load_pair(model, draft, device=device)
    mels = torch.cat(file_mels(pair, files))  # [n, n_mels, 3000]
    hf_dir = None
    with tempfile.TemporaryDirectory() as tmp:
        if with_hf:
            from specasr.models.hf_export import export_hf

            hf_dir = export_hf(draft_file, model, Path(tmp) / "draft").out
        sizes = [int(b) for b in batches.split(",")]
        rows = bench(pair, mels, sizes, repeats, gamma, hf_dir, model, gamma_max)
    name = torch.cuda.get_device_name(pair.device) if pair.device.type == "cuda" else "CPU"
    click.echo(
        f"\n{model} + {draft} on {name} ({pair.dtype}), {len(files)} LibriVox clips, median of {repeats}\n"
    )
    click.echo(table(rows))
    if breakdown:
        for B in sizes:
            index = [i % len(files) for i in range(B)]
            with torch.inference_mode():
                states = pair.encode(mels[index].to(pair.device))[0]
            click.echo("\n" + breakdown_table(pair, states, gamma))
    if with_transcribe:
        click.echo(f"\ntranscribe_clip over {len(files)} clips, median of {repeats}\n")
        click.echo(transcribe_table(pair, files, repeats))
    if with_fw:
        click.echo("\n" + faster_whisper_row(files, pair.device.type, repeats, model))


if __name__ == "__main__":
    main()
