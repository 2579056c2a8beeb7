"""`specasr` command line: a thin click front end over the library.

Commands live one module per family (transcribe, eval, app, distill, bench); this one holds
the group and `models`. Exit codes: 0 success, 1 some input failed (the others were still processed),
2 usage error, 130 interrupted (transcribe, eval).
"""

from __future__ import annotations

import click

from specasr.cli.app import app as app_command
from specasr.cli.bench import bench as bench_command
from specasr.cli.distill import distill as distill_command
from specasr.cli.eval import eval_ as eval_command
from specasr.cli.transcribe import transcribe as transcribe_command


@click.group()
@click.version_option(package_name="specasr")
def main() -> None:
    """Whisper transcription with exact speculative decoding."""


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
