"""`specasr` command line: a thin click front end over the library.

Commands live one module per family (transcribe, eval, app, distill, bench); this one holds
the group and `models`. Exit codes: 0 success, 1 some input failed (the others were still processed),
2 usage error, 130 interrupted (transcribe, eval).
"""

from __future__ import annotations

import atexit
import os
import sys

import click

from specasr.backends.cpu import heap
from specasr.cli.app import app as app_command
from specasr.cli.bench import bench as bench_command
from specasr.cli.common import claim_process
from specasr.cli.distill import distill as distill_command
from specasr.cli.eval import eval_ as eval_command
from specasr.cli.transcribe import transcribe as transcribe_command


@click.group()
@click.version_option(package_name="specasr")
def main() -> None:
    """Whisper transcription with exact speculative decoding."""
    heap.lean_heap()  # blocks over 2 MB go back on free (specasr.backends.cpu.heap)


def run() -> None:
    """The `specasr` command (`python -m specasr` too): `main`, then a quick exit. Once main
    has finished, the atexit handlers run (the app's temporary directory, logging, Ray), stdout
    and stderr are flushed, and the process ends with main's status through os._exit. What
    that skips is the interpreter's teardown of torch and the models (destructors, freeing
    hundreds of MB), about 0.3 s of every run that a finished process does not need
    (docs/benchmarks.md, "Start-up"). Anything but SystemExit (a crash) leaves the usual way,
    with its traceback. `main` itself stays a plain click group (tests, embedding)."""
    claim_process()  # model loading may freeze what it made for the collector (`common.start_up`)
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
    run_handlers = getattr(atexit, "_run_exitfuncs", None)  # CPython's; elsewhere exit as usual
    if run_handlers is None:
        sys.exit(code)
    run_handlers()  # the handlers a normal exit would run, once
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`) or stream: nothing to keep
            pass
    os._exit(code)


for _command in (transcribe_command, eval_command, app_command, distill_command, bench_command):
    main.add_command(_command)


@main.command()
def models() -> None:
    """List the model presets and whether each is available locally."""
    from specasr.models.loading import list_presets

    rows = list_presets()
    click.echo(f"{'preset':<10} {'local':<6} {'target':<28} draft")
    for row in rows:
        local = "yes" if row["available_locally"] else "no"
        click.echo(f"{row['name']:<10} {local:<6} {row['target']:<28} {row['draft']}")
