"""`specasr serve`: an OpenAI-compatible transcription server (specasr.apps.server) over one
loaded pair of models.

Every option is checked before any model loads (exit 2); a model that cannot be loaded exits
1, Ctrl-C while loading 130. Serving, SIGTERM or Ctrl-C: the server stops taking requests,
every running one finishes with its answer (those still waiting get 503), and the command
exits 0 with its temporary files gone.
"""

from __future__ import annotations

import socket
import sys

import click

from specasr.apps.openai_api import ServerSettings
from specasr.cli.common import (
    check_compute_type,
    check_model_options,
    load_models,
    model_options,
    threads_option,
)

_SERVER = ServerSettings()


def check_address(host: str, port: int) -> None:
    """A usage error (exit 2), before the models load, when nothing can listen at host:port."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as e:
        raise click.BadParameter(f"{host!r}: {e}", param_hint="'--host'") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as e:
            raise click.BadParameter(
                f"cannot listen on {host}:{port}: {e.strerror or e}", param_hint="'--host' / '--port'"
            ) from None


@click.command("serve")
@model_options
@threads_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; the default serves this machine only (0.0.0.0: the network).",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--api-key",
    envvar="SPECASR_API_KEY",
    show_envvar=True,
    default=None,
    help="Require 'Authorization: Bearer KEY' on every /v1 request (default: no key).",
)
@click.option(
    "--max-upload-mb",
    type=float,
    default=_SERVER.max_upload_mb,
    show_default=True,
    help="Largest file, in MiB.",
)
@click.option(
    "--max-seconds",
    type=float,
    default=_SERVER.max_seconds,
    show_default=True,
    help="Longest audio, in seconds (refused from its header, before it is decoded).",
)
@click.option(
    "--max-concurrent",
    type=int,
    default=_SERVER.max_concurrent,
    show_default=True,
    help="Transcriptions running at once; their greedy passes decode together as rows of one batch.",
)
@click.option(
    "--max-queue",
    type=int,
    default=_SERVER.max_queue,
    show_default=True,
    help="Requests allowed to wait beyond those; more get 429.",
)
@click.option(
    "--request-timeout",
    type=float,
    default=_SERVER.request_timeout,
    show_default=True,
    help="Seconds from a request's arrival to its answer; past it: 504, and the transcription stops.",
)
@click.option(
    "--max-batch",
    type=int,
    default=_SERVER.max_batch,
    show_default=True,
    help="Rows (30 s windows) of one shared decode batch.",
)
def serve(
    model,
    draft,
    device,
    dtype,
    compute_type,
    threads,
    host,
    port,
    api_key,
    max_upload_mb,
    max_seconds,
    max_concurrent,
    max_queue,
    request_timeout,
    max_batch,
):
    """Serve OpenAI's audio API (POST /v1/audio/transcriptions and /translations) over one
    loaded model pair; the endpoints take the transcribe command's options as form fields.
    See docs/serve.md."""
    try:
        settings = ServerSettings(
            model=model,
            api_key=api_key,
            max_upload_mb=max_upload_mb,
            max_seconds=max_seconds,
            max_concurrent=max_concurrent,
            max_queue=max_queue,
            request_timeout=request_timeout,
            max_batch=max_batch,
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    mode = "autoregressive" if draft == "none" else "exact"  # with a draft, requests may speculate
    check_model_options(model, draft, mode, None, "transcribe")
    check_compute_type(compute_type, mode)
    check_address(host, port)
    try:
        from specasr.apps.server import create_app
        from specasr.apps.server import serve as run_server
    except ImportError as e:
        click.echo(
            f"error: the server needs FastAPI and uvicorn ({e}): pip install 'specasr[serve]'", err=True
        )
        sys.exit(1)
    try:
        pair = load_models(model, draft, mode, device, dtype, compute_type, threads=threads)
    except KeyboardInterrupt:
        click.echo("interrupted while loading the models", err=True)
        sys.exit(130)
    run_server(create_app(pair, settings), host, port)  # returns once stopped and shut down
