"""`specasr` command line: a thin click front end over the library.

Commands live one module per family (transcribe, serve, eval, app, distill, bench, calibrate); this one holds
the group and `models`. Exit codes: 0 success, 1 some input failed (the others were still processed),
2 usage error, 130 interrupted (transcribe, eval).
"""

from __future__ import annotations

import sys

import click

from specasr.backends import process
from specasr.cli.app import app as app_command
from specasr.cli.bench import bench as bench_command
from specasr.cli.calibrate import calibrate as calibrate_command
from specasr.cli.common import check_compute_type, load_models, model_options
from specasr.cli.distill import distill as distill_command
from specasr.cli.eval import eval_ as eval_command
from specasr.cli.serve import serve as serve_command
from specasr.cli.transcribe import transcribe as transcribe_command

# Commands that serve until stopped keep glibc's own heap policy: a server's per-request
# temporaries stay in the heap and are reused, where the lean policy would map and fault them in
# afresh for every request (docs/benchmarks.md, "The server")
SERVING = ("serve", "app")


@click.group()
@click.version_option(package_name="specasr")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Whisper transcription with exact speculative decoding."""
    if ctx.invoked_subcommand not in SERVING:
        process.lean_heap()  # blocks over 2 MB go back on free (specasr.backends.process)
        process.defer_torch_parts()  # before torch is imported: parts a CPU run never uses


def run() -> None:
    """The `specasr` command (`python -m specasr` too): `main`, then a quick exit
    (`specasr.backends.process.quick_exit`, switch SPECASR_QUICK_EXIT): the atexit handlers
    run, stdout and stderr are flushed, and the process ends with main's status without the
    interpreter's teardown of torch and the models. Anything but SystemExit (a crash) leaves
    the usual way, with its traceback. `main` itself stays a plain click group (tests,
    embedding)."""
    process.claim_process()  # model loading may freeze what it made for the collector (`process.start_up`)
    process.passive_when_busy()  # before torch loads its OpenMP runtime
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, status 1, as Python does
        print(code, file=sys.stderr)
        code = 1
    process.quick_exit(code)


for _command in (
    transcribe_command,
    eval_command,
    app_command,
    distill_command,
    bench_command,
    serve_command,
    calibrate_command,
):
    main.add_command(_command)


@main.command()
@click.option(
    "--explain",
    is_flag=True,
    help="Load --model/--draft and say which implementation each model's layers run, and why.",
)
@model_options
def models(
    explain: bool, model: str, draft: str, device: str | None, dtype: str | None, compute_type: str
) -> None:
    """List the model presets and whether each is available locally; --explain: load a pair
    and say how it runs."""
    if explain:
        check_compute_type(compute_type, "exact")
        pair = load_models(model, draft, "exact", device, dtype, compute_type)
        for line in pair.explain():
            click.echo(line)
        return
    from specasr.models.loading import list_presets

    rows = list_presets()
    click.echo(f"{'preset':<10} {'local':<6} {'target':<28} draft")
    for row in rows:
        local = "yes" if row["available_locally"] else "no"
        click.echo(f"{row['name']:<10} {local:<6} {row['target']:<28} {row['draft']}")
