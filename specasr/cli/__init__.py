"""`specasr` command line: a thin click front end over the library.

Commands live one module per family (transcribe, serve, eval, app, distill, bench, calibrate); this one holds
the group and `models`. Exit codes: 0 success, 1 some input failed (the others were still processed),
2 usage error, 130 interrupted (transcribe, eval).
"""

from __future__ import annotations

import importlib
import sys

import click

from specasr.backends import process
from specasr.cli.common import check_compute_type, load_models, model_options

# Commands that serve until stopped keep glibc's own heap policy: a server's per-request
# temporaries stay in the heap and are reused, where the lean policy would map and fault them in
# afresh for every request (docs/benchmarks.md, "The server")
SERVING = ("serve", "app")

# name -> "module:attribute". A command's module is imported when that command runs (or help
# lists it): `specasr transcribe` does not import the app's and the server's modules, about 20 ms
# of every start-up (docs/benchmarks.md, "Start-up and whole process")
COMMANDS = {
    "transcribe": "specasr.cli.transcribe:transcribe",
    "eval": "specasr.cli.eval:eval_",
    "app": "specasr.cli.app:app",
    "distill": "specasr.cli.distill:distill",
    "bench": "specasr.cli.bench:bench",
    "serve": "specasr.cli.serve:serve",
    "calibrate": "specasr.cli.calibrate:calibrate",
}


class LazyGroup(click.Group):
    """A click group whose `COMMANDS` are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in COMMANDS and name not in self.commands:
            module, attribute = COMMANDS[name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup)
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
