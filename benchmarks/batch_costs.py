"""What speculation costs at B rows on this machine, against the stored batch cost table.

    python -m benchmarks.batch_costs --model base --draft default --rows 2,4,8 --repeats 20
        [--compute-type int8]

The backoff γ policy judges a pass over B > 1 rows (the chunked strategy's batch of windows)
under a stored cost curve, `specasr.decode.gamma.cpu_batch_costs` (`CPU_BATCH_COSTS`, or
`CPU_BATCH_COSTS_INT8` for an int8 target): c = draft step ÷ target
step and v(k) = target pass over k tokens ÷ pass over one, both at B rows. Stored numbers keep
the policy deterministic; they were measured on one CPU. This measures the same quantities
here (`benchmarks.speedup.step_costs` over B copies of the first LibriVox clip's window,
uniform rows), prints them beside the stored curve for its compute type, and prints the
measured curves as a literal of that table. One process, one run; medians of `--repeats` passes.
"""

from __future__ import annotations

import click

from specasr.cli.common import compute_type_option
from specasr.constants import int8_decoder
from specasr.decode.calibration import cost_table
from specasr.decode.gamma import SpeculationCost, cpu_batch_costs


def measured_cost(costs) -> SpeculationCost:
    """A `speedup.StepCosts` as a `SpeculationCost`: c and v(k) relative to its one-token pass."""
    return SpeculationCost(costs.draft / costs.target[1], costs.verify_curve())


def cost_literal(measured: dict[int, SpeculationCost]) -> str:
    """The measured curves as Python, in `CPU_BATCH_COSTS`' form."""
    lines = ["{"]
    for rows, cost in measured.items():
        curve = ", ".join(f"{k}: {v:.2f}" for k, v in sorted(cost.verify.items()))
        lines.append(f"    {rows}: SpeculationCost({cost.c:.3f}, {{{curve}}}),")
    return "\n".join([*lines, "}"])


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True, help="Draft spec; default: the preset's.")
@click.option("--rows", default="2,4,8", show_default=True, help="Batch sizes, comma-separated.")
@click.option("--repeats", type=int, default=20, show_default=True, help="Timed passes per k.")
@click.option("--max-k", type=int, default=8, show_default=True, help="Passes over 1 … this many tokens.")
@click.option(
    "--data", type=click.Path(exists=True, file_okay=False), default="tests/data", show_default=True
)
@compute_type_option("The target's (`load_pair`).")
def main(model, draft, rows, repeats, max_k, data, compute_type) -> None:
    from pathlib import Path

    import torch

    from benchmarks.speedup import step_costs
    from specasr.eval.bench import file_mels
    from specasr.models.loading import load_pair

    try:
        sizes = [int(r) for r in rows.split(",") if r.strip()]
    except ValueError as e:
        raise click.BadParameter(f"{rows!r}: expected integers such as 2,4,8", param_hint="--rows") from e
    if not sizes or min(sizes) < 1 or max_k < 1:
        raise click.BadParameter("batch sizes and --max-k must be at least 1")
    files = sorted(Path(data).glob("*.wav"))
    if not files:
        raise click.BadParameter(f"no .wav files in {data}", param_hint="--data")
    pair = load_pair(model, draft, compute_type=compute_type)
    if pair.draft is None:
        raise click.BadParameter("batch costs need a draft", param_hint="--draft")
    mel = file_mels(pair, files[:1])[0]  # [1, n_mels, 3000]
    ks = list(range(1, max_k + 1))
    measured = {}
    with torch.inference_mode():
        for b in sizes:
            batch = mel.expand(b, -1, -1).contiguous()  # [b, n_mels, 3000]: b alike rows
            costs = step_costs(pair, batch, ks=tuple(ks), repeats=repeats, eager=False)
            measured[b] = measured_cost(costs)
    click.echo(
        f"{model} [{pair.compute_type}] + draft {pair.draft_name}, {torch.get_num_threads()} threads, "
        f"{repeats} passes per k, uniform rows\n"
    )
    int8 = int8_decoder(pair.compute_type)  # the table the loop's backoff policy reads
    click.echo(cost_table(measured, cpu_batch_costs(int8), ks))
    name = "CPU_BATCH_COSTS_INT8" if int8 else "CPU_BATCH_COSTS"
    click.echo(f"\nAs `{name}`:\n\n{cost_literal(measured)}")


if __name__ == "__main__":
    main()
