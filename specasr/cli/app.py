"""`specasr app`: serve the Gradio app (specasr.apps.gradio_app) over one loaded model pair."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

import click

from specasr.apps.service import AppOptions
from specasr.cli.common import load_models, model_options

_APP = AppOptions()


@click.command("app")
@model_options
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; the default serves this machine only (0.0.0.0 serves the network).",
)
@click.option("--port", type=int, default=7860, show_default=True)
@click.option("--share", is_flag=True, help="Also open a public Gradio share link (off unless asked for).")
@click.option("--max-seconds", type=float, default=_APP.max_seconds, show_default=True, help="Longest audio.")
@click.option(
    "--max-upload-mb", type=float, default=_APP.max_upload_mb, show_default=True, help="Largest upload."
)
@click.option(
    "--concurrency",
    type=int,
    default=_APP.concurrency_limit,
    show_default=True,
    help="Requests decoded at once (the others wait in the queue).",
)
def app(model, draft, device, dtype, host, port, share, max_seconds, max_upload_mb, concurrency):
    """Launch the Gradio app: microphone or upload, mode toggles, a live speed comparison."""
    try:
        options = AppOptions(
            max_seconds=max_seconds, max_upload_mb=max_upload_mb, concurrency_limit=concurrency
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    if not os.environ.get("GRADIO_TEMP_DIR"):  # uploads and recordings live, and go, with this process
        os.environ["GRADIO_TEMP_DIR"] = tempfile.mkdtemp(prefix="specasr-app-")
        atexit.register(shutil.rmtree, os.environ["GRADIO_TEMP_DIR"], ignore_errors=True)
    try:  # gradio reads GRADIO_TEMP_DIR as it is imported, too
        from specasr.apps.gradio_app import build_app, launch
    except ImportError as e:
        click.echo(f"error: the app needs gradio ({e}): pip install 'specasr[app]'", err=True)
        sys.exit(1)
    pair = load_models(model, draft, "exact", device, dtype)
    launch(build_app(pair, options), options, host=host, port=port, share=share)
