"""`specasr serve`: OpenAI's audio endpoints on FastAPI, over one loaded pair of models and one
`SharedEngine` (longform/engine.py) that decodes the greedy passes of concurrent requests as
rows of one batch.

A request: its key is checked (401); it is admitted, at most `max_concurrent` running and
`max_queue` more in the server, else 429 (serve_queue.py); its form is read, the file written
into the server's temporary directory and counted as it comes, 413 past the limit
(serve_upload.py); its fields become the CLI's options, 400 for a bad one (openai_api.py); it
waits for a turn; then a worker thread (serve_work.py) loads the audio within `max_seconds` (a
header's length is checked first and decoding stops at the limit, so a small file that expands
to hours is refused without being decoded: 413) and transcribes it through the engine,
checking the request's deadline between segments (504, and the transcription stops before its
next window; a client that hangs up stops it too). The file goes when the worker is done,
whatever the answer. Every error is OpenAI's `{"error": {...}}`, never a traceback.

Shutdown (SIGTERM or SIGINT through `Server`, or the app's lifespan ending): new requests get
503 and the listener closes; running transcriptions finish with their complete answer, those
still waiting for a turn get 503; then the engine closes and the temporary directory goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from specasr.backends import process
from specasr.longform.engine import SharedEngine

from .openai_api import (
    ApiError,
    Served,
    ServerSettings,
    TranscriptionRequest,
    error_body,
    invalid,
    model_list,
    model_object,
    parse_request,
    timed_out,
)
from .private_dirs import private_dir
from .serve_queue import Admission
from .serve_upload import read_upload
from .serve_work import transcribe_upload

__all__ = ["Server", "ServerSettings", "create_app", "serve"]

log = logging.getLogger("specasr.serve")
TEMP_PREFIX = "specasr-serve-"  # + pid + "-": the server's own directory for uploads


class Service:
    """The server's state and its request handling, behind the routes of `create_app`."""

    def __init__(self, pair, settings: ServerSettings, engine: SharedEngine | None) -> None:
        if engine is not None and engine.pair is not pair:
            raise ValueError("the engine runs another pair of models than the one given")
        self.pair, self.settings = pair, settings
        self.own_engine = engine is None  # an engine made here is closed here
        self.engine = SharedEngine(pair, max_rows=settings.max_batch) if engine is None else engine
        self.served = Served.of(pair, settings)
        self.admission = Admission(settings.max_concurrent, settings.max_queue)
        # a request's thread reads the audio and computes its features on itself alone: the engine
        # thread's OpenMP team stays the process's only one (`process.one_openmp_team`)
        self.workers = ThreadPoolExecutor(
            settings.max_concurrent, thread_name_prefix="specasr-request", initializer=process.one_thread_here
        )
        # removed at exit if the lifespan never ends, and by the next start after a SIGKILL
        self.temp_dir = Path(private_dir(TEMP_PREFIX))
        self.created = int(time.time())
        self.loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle ---------------------------------------------------------------------------
    def drain(self) -> None:
        """Thread- and signal-safe: new requests and those waiting for a turn get 503."""
        self.admission.draining = True
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.admission.drain)

    async def close(self) -> None:
        """After the last answer: waits for the workers (a timed-out one stops at its next
        window), closes an engine made here, removes the temporary directory."""
        self.admission.drain()
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        self.workers.shutdown(wait=True)
        if self.own_engine:
            self.engine.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    # ---- requests ----------------------------------------------------------------------------
    def authorize(self, request: Request) -> None:
        key = self.settings.api_key
        if key is None:
            return
        header = request.headers.get("authorization", "")
        if not header:
            raise ApiError(
                401, "Missing API key: send it as 'Authorization: Bearer KEY'.", code="invalid_api_key"
            )
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")

    async def transcription(self, request: Request, task: str) -> Response:
        deadline = time.monotonic() + self.settings.request_timeout
        self.authorize(request)
        self.admission.enter()
        upload = None
        try:
            reading = read_upload(
                request.headers.get("content-type", ""),
                request.headers.get("content-length"),
                request.stream(),
                self.temp_dir,
                self.settings.max_upload_bytes,
            )
            try:
                upload = await asyncio.wait_for(reading, max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise timed_out(self.settings.request_timeout) from None
            job = parse_request(upload.fields, task, self.served)
            if job.options.vad is not None:
                _check_vad()
            await self.admission.turn(deadline - time.monotonic(), timed_out(self.settings.request_timeout))
            mine, upload = upload, None  # the worker's now: it removes the file when done
            body, media = await self._run(request, mine, job, deadline)
        finally:
            self.admission.leave()
            if upload is not None:
                upload.remove()
        return JSONResponse(body) if isinstance(body, dict) else Response(body, media_type=media)

    async def _run(self, request: Request, upload, job: TranscriptionRequest, deadline: float):
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        args = (upload.path, job, self.pair, self.engine, self.settings, deadline, stop)
        work = loop.run_in_executor(self.workers, transcribe_upload, *args)
        work.add_done_callback(lambda w: self._ended(w, upload))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            left = max(0.0, deadline - time.monotonic())
            await asyncio.wait({work, gone}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                stop.set()  # the worker stops before its next window
        if not work.done():
            if gone.done() and not gone.cancelled():
                raise ApiError(400, "The client closed the connection.", code="client_closed")
            raise timed_out(self.settings.request_timeout)
        return work.result()

    def _ended(self, work: asyncio.Future, upload) -> None:
        """A worker is done, however its request ended: its slot and its file go."""
        self.admission.done()
        upload.remove()
        if not work.cancelled():
            work.exception()  # retrieved: an answer already sent needs no "never retrieved" warning

    async def models(self, request: Request, model_id: str | None = None) -> Response:
        self.authorize(request)
        if model_id is None:
            return JSONResponse(model_list(self.served, self.created))
        if model_id not in self.served.ids:
            raise ApiError(
                404, f"The model {model_id!r} does not exist.", param="model", code="model_not_found"
            )
        return JSONResponse(model_object(model_id, self.created))

    def health(self) -> dict:
        a = self.admission
        return {
            "status": "shutting_down" if a.draining else "ok",
            "model": self.served.ids[0],
            "draft": self.pair.draft_name if self.pair.draft is not None else None,
            "running": a.running,
            "queued": a.queued,
        }


def _check_vad() -> None:
    from specasr.longform.vad import weights_path

    try:
        weights_path()
    except RuntimeError as e:
        raise invalid(str(e), "vad", "unsupported_parameter") from None


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone; the body was read before, so the only message left
    to receive is the disconnect (or a spurious empty body part, skipped)."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


INTERNAL = ApiError(
    500, "The server had an error while processing your request.", type="server_error", code="internal_error"
)


async def _answer(call) -> Response:
    """A route's answer, or its error as OpenAI's error object (a traceback only in the log)."""
    try:
        return await call
    except ApiError as e:
        return error_response(e)
    except ClientDisconnect:
        return error_response(ApiError(400, "The client closed the connection.", code="client_closed"))
    except Exception:
        log.exception("request failed")
        return error_response(INTERNAL)


def create_app(pair, settings: ServerSettings, engine: SharedEngine | None = None) -> FastAPI:
    """The server's app over `pair`. `engine`: the SharedEngine its requests decode through
    (one is made, with `settings.max_batch` rows, and closed at shutdown when not given; a
    given one stays the caller's to close). Serve it with `serve` (or any ASGI server that
    runs its lifespan: the shutdown waits for the workers and removes the temporary files)."""
    service = Service(pair, settings, engine)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        service.loop = asyncio.get_running_loop()
        try:
            yield
        finally:
            await service.close()

    app = FastAPI(title="specasr", summary="Whisper with exact speculative decoding", lifespan=lifespan)
    app.state.service, app.state.engine, app.state.temp_dir = service, service.engine, service.temp_dir

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> Response:
        return await _answer(service.transcription(request, "transcribe"))

    @app.post("/v1/audio/translations")
    async def translations(request: Request) -> Response:
        return await _answer(service.transcription(request, "translate"))

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await _answer(service.models(request))

    @app.get("/v1/models/{model_id}")
    async def model(request: Request, model_id: str) -> Response:
        return await _answer(service.models(request, model_id))

    @app.get("/health")
    async def health() -> dict:
        return service.health()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message, code = f"Invalid URL ({request.method} {request.url.path}).", "unknown_url"
        elif exc.status_code == 405:
            message, code = (
                f"Method {request.method} is not allowed on {request.url.path}.",
                "method_not_allowed",
            )
        else:
            message, code = str(exc.detail), None
        body = error_body(message, "invalid_request_error", None, code)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        where = [str(p) for p in first.get("loc", ())]
        message = f"{' '.join(where[-1:]) or 'request'}: {first.get('msg', 'invalid value')}"
        body = error_body(message, "invalid_request_error", where[-1] if where else None, "invalid_value")
        return JSONResponse(body, status_code=422)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(INTERNAL)

    return app


class Server(uvicorn.Server):
    """uvicorn's server, whose SIGTERM and SIGINT first drain the app (`Service.drain`) and
    then end the process normally, with status 0, instead of re-raising the signal once the
    server has stopped. A second SIGINT stops at once, as uvicorn's does."""

    def __init__(self, config: uvicorn.Config, service: Service) -> None:
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig: int, frame) -> None:
        self.service.drain()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True


def server(app: FastAPI, host: str, port: int, log_level: str = "info") -> Server:
    """A `Server` for an app of `create_app` (run it with `.run()`, stop it with
    `.handle_exit(signal.SIGTERM, None)` from any thread)."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, lifespan="on", timeout_graceful_shutdown=None
    )
    return Server(config, app.state.service)


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serves `app` until SIGTERM or SIGINT; returns once every answer is sent and the app is shut down."""
    server(app, host, port, log_level).run()
