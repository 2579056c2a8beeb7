"""`specasr app`: serve the Gradio app (specasr.apps.gradio_app) over one loaded model pair."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys

import click

from specasr.apps.private_dirs import private_dir
from specasr.apps.service import AppOptions
from specasr.cli.common import check_compute_type, load_models, model_options, threads_option

_APP = AppOptions()
TEMP_PREFIX = "specasr-app-"  # + owner pid + "-": the app's private GRADIO_TEMP_DIR
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def private_temp_dir() -> str:
    """A fresh `specasr-app-<pid>-*` directory, removed when this process exits (normally, on
    Ctrl-C, or on SIGTERM / SIGHUP while the app serves); stale ones are removed first."""
    return private_dir(TEMP_PREFIX)


@contextlib.contextmanager
def _stop_on_signals(temp_dir: str | None):
    """While serving, SIGTERM (systemd, docker stop) and SIGHUP stop the app as Ctrl-C does:
    the temp dir goes at once, then Gradio closes its server and the command returns."""

    def stop(signum, frame):
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    before = {}
    for sig in STOP_SIGNALS:
        with contextlib.suppress(ValueError):  # not the main thread: leave them be
            before[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@click.command("app")
@model_options
@threads_option
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
def app(
    model,
    draft,
    device,
    dtype,
    compute_type,
    threads,
    host,
    port,
    share,
    max_seconds,
    max_upload_mb,
    concurrency,
):
    """Launch the Gradio app: microphone or upload, mode toggles, a live speed comparison."""
    check_compute_type(compute_type, "exact")  # the app offers the speculative modes
    try:
        options = AppOptions(
            max_seconds=max_seconds, max_upload_mb=max_upload_mb, concurrency_limit=concurrency
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    temp_dir = None
    if not os.environ.get("GRADIO_TEMP_DIR"):  # uploads and recordings live, and go, with this process
        temp_dir = os.environ["GRADIO_TEMP_DIR"] = private_temp_dir()
    try:  # gradio reads GRADIO_TEMP_DIR as it is imported, too
        from specasr.apps.gradio_app import build_app, launch
    except ImportError as e:
        click.echo(f"error: the app needs gradio ({e}): pip install 'specasr[app]'", err=True)
        sys.exit(1)
    with _stop_on_signals(temp_dir):
        # a long-lived server: the fp16-packed decoder forms' packing time pays back
        pair = load_models(
            model, draft, "exact", device, dtype, compute_type, half_weights=True, threads=threads
        )
        launch(build_app(pair, options), options, host=host, port=port, share=share)
