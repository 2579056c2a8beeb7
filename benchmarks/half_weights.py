"""fp16-packed decoder weights against fp32-packed ones, side by side (issue 20).

    python -m benchmarks.half_weights --repeats 4

`specasr.models.whisper.use_half_weights` gives an fp16 checkpoint's decoder matrices and
head an fbgemm fp16-packed form for passes of few rows (`specasr.backends.cpu.linear.HalfPackedLinear`,
`HalfPackedHead`), the same fp32 products from half the bytes, which long-lived processes ask for
(`load_pair(half_weights=True)`: the app, eval runs). This loads the pair twice in one
process, with oneDNN fp32-packed weights only (the default) and with the fp16 forms, then
transcribes the long-form fixture (`benchmarks.longform.long_recording`) with each, in
autoregressive and exact mode, sequentially and chunked with VAD, interleaved over
`--repeats` rounds after a warm-up. It prints medians of the decoder phase and of wall time
(samples to segments), each form's speed against the other, and whether every run gave the
same tokens (they must: the two forms compute the same function); then what the forms cost at
start-up: import + `load_pair` in fresh processes, interleaved (`--load-rounds`).
"""

from __future__ import annotations

import statistics
import time

import click

from specasr.options import TranscribeOptions

FORMS = {"fp32-packed": False, "fp16-packed": True}  # name -> load_pair(half_weights=)


def load_both(model: str, draft: str) -> dict:
    """The pair loaded once per form of the decoder weights."""
    from specasr.models.loading import load_pair

    return {name: load_pair(model, draft, half_weights=half) for name, half in FORMS.items()}


LOAD = (
    "import sys, time; t = time.perf_counter(); from specasr.models.loading import load_pair; "
    "load_pair(sys.argv[1], sys.argv[2], half_weights=sys.argv[3] == '1'); "
    "print(time.perf_counter() - t)"
)


def load_times(model: str, draft: str, rounds: int) -> dict[str, list[float]]:
    """Seconds of import + `load_pair` per form, each in a fresh process, interleaved."""
    import subprocess
    import sys

    times: dict[str, list[float]] = {name: [] for name in FORMS}
    for _ in range(rounds):
        for name, half in FORMS.items():
            args = [sys.executable, "-c", LOAD, model, draft, "1" if half else "0"]
            out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
            times[name].append(float(out.strip().splitlines()[-1]))
    return times


def configurations() -> dict[str, TranscribeOptions]:
    from specasr.longform.vad import VadOptions

    seq = TranscribeOptions()
    chunked = TranscribeOptions(strategy="chunked", vad=VadOptions())
    return {
        f"{strategy}, {mode}": opts.with_decode(mode=mode)
        for strategy, opts in (("sequential", seq), ("chunked + VAD", chunked))
        for mode in ("autoregressive", "exact")
    }


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--data", type=click.Path(exists=True, file_okay=False), default="tests/data", show_default=True
)
@click.option(
    "--load-rounds",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Fresh processes per form timing import + load_pair (0: skip).",
)
def main(model: str, draft: str, repeats: int, data: str, load_rounds: int) -> None:
    from benchmarks.longform import long_recording
    from specasr.constants import SAMPLE_RATE
    from specasr.transcription import transcribe

    rec = long_recording(data)
    pairs = load_both(model, draft)
    configs = configurations()
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    tokens = set()
    for rnd in range(repeats + 1):  # round 0 warms up
        for config, opts in configs.items():
            for form, pair in pairs.items():
                t0 = time.perf_counter()
                segments, info = transcribe(rec.samples, pair, opts, source_rate=SAMPLE_RATE)
                toks = [s.tokens for s in segments]
                wall = time.perf_counter() - t0
                tokens.add((config.split(",")[0], str(toks)))
                if rnd:
                    runs.setdefault((config, form), []).append((info.stats.decoder_s, wall))
    same = len(tokens) == len({c.split(",")[0] for c in configs})
    click.echo(
        f"{model} + {draft}, {len(rec.samples) / SAMPLE_RATE:.1f} s long-form fixture, {repeats} rounds; "
        f"same tokens in every run of a strategy: {'yes' if same else 'NO'}\n"
    )
    click.echo(
        "| configuration | decoder s, fp32-packed | decoder s, fp16-packed | decoder speed-up "
        "| wall s, fp32-packed | wall s, fp16-packed | wall speed-up |"
    )
    click.echo("|---|---|---|---|---|---|---|")
    for config in configs:
        a, b = runs[(config, "fp32-packed")], runs[(config, "fp16-packed")]
        da, db = (statistics.median(r[0] for r in x) for x in (a, b))
        wa, wb = (statistics.median(r[1] for r in x) for x in (a, b))
        click.echo(
            f"| {config} | {da:.2f} | {db:.2f} | {da / db:.2f}× | {wa:.2f} | {wb:.2f} | {wa / wb:.2f}× |"
        )

    if load_rounds:
        loads = {name: statistics.median(t) for name, t in load_times(model, draft, load_rounds).items()}
        a, b = loads["fp32-packed"], loads["fp16-packed"]
        click.echo(
            f"\nimport + load_pair, fresh processes, median of {load_rounds}: fp32-packed {a:.2f} s, "
            f"fp16-packed {b:.2f} s ({b - a:+.2f} s)"
        )


if __name__ == "__main__":
    main()
