"""`specasr calibrate`: measure what speculation costs on this machine, store it, print it."""

from __future__ import annotations

import sys

import click

from specasr.cli.common import check_compute_type, load_models, model_options, threads_option


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(r) for r in text.split(",") if r.strip()}))
    except ValueError as e:
        raise click.BadParameter(
            f"{text!r}: expected batch sizes such as 1,2,4,8", param_hint="--rows"
        ) from e
    if not sizes or sizes[0] < 1 or 1 not in sizes:
        raise click.BadParameter(f"{text!r}: batch sizes >= 1, including 1", param_hint="--rows")
    return sizes


@click.command()
@model_options
@threads_option
@click.option(
    "--rows",
    default="1,2,4,8",
    show_default=True,
    help="Batch sizes to measure (1: sequential decoding; more: the chunked strategy's batches).",
)
@click.option("--repeats", type=click.IntRange(1, 100), default=None, help="Timed rounds [4].")
def calibrate(model, draft, device, dtype, compute_type, threads, rows, repeats) -> None:
    """Measure what speculation costs on this machine for --model and its draft: the draft's
    step and the target's passes over 1-8 tokens, per batch size, relative to one target step.
    The curves are stored in the cache (keyed by CPU, --threads, torch and the models' shapes)
    and decide, from then on, when the backoff gamma policy speculates; a speculative decode
    measures them by itself the first time (SPECASR_CALIBRATE=off: the built-in tables)."""
    from specasr.decode import calibration

    sizes = _sizes(rows)
    check_compute_type(compute_type, "exact")
    pair = load_models(model, draft, "exact", device, dtype, compute_type, threads=threads)
    if pair.draft is None:
        raise click.UsageError(f"--draft {draft}: calibration measures a draft against its target; give one")
    if pair.device.type != "cpu":
        raise click.UsageError("calibration is for CPUs; on an accelerator gamma adapts as it decodes")
    measured, path = calibration.calibrate(pair, sizes, repeats or calibration.REPEATS)
    measured = {b: measured[b] for b in sizes}
    stored = calibration.stored_tables(pair)
    key = calibration.calibration_key(pair)
    click.echo(
        f"{model} [{pair.compute_type}] + draft {pair.draft_name} on {key['cpu']['model']} "
        f"({key['capability']}), {key['threads']} threads\n"
    )
    click.echo(calibration.cost_table(measured, stored, list(range(1, calibration.MAX_K + 1))))
    click.echo("\nbreak-even acceptance α (speculation pays above it):")
    for b, cost in measured.items():
        old = stored.get(b)
        was = f" (built-in table: {old.break_even():.2f})" if old is not None else ""
        pays = "" if cost.can_pay() else ", never pays: decoding stays target-only"
        click.echo(f"  {b} row{'s' if b > 1 else ''}: {cost.break_even():.2f}{was}{pays}")
    click.echo(f"\nstored in {path}")
    sys.stdout.flush()
