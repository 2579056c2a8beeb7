"""`specasr serve`'s app run in-process for tests: uvicorn on a free port in a background
thread, stopped (drained, then shut down through the app's lifespan) when the block ends."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
from specasr.apps.server import Server, server


@dataclass
class Running:
    server: Server
    url: str  # http://127.0.0.1:PORT
    app: object

    def stop(self) -> None:
        """SIGTERM's path: waiting requests get 503, running ones finish, then the app shuts down."""
        self.server.handle_exit(signal.SIGTERM, None)


@contextlib.contextmanager
def serving(app, timeout: float = 60.0) -> Iterator[Running]:
    srv = server(app, "127.0.0.1", 0, log_level="warning")
    thread = threading.Thread(target=srv.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not srv.started:
        assert thread.is_alive(), "the server stopped while starting"
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    port = srv.servers[0].sockets[0].getsockname()[1]
    running = Running(srv, f"http://127.0.0.1:{port}", app)
    try:
        yield running
    finally:
        running.stop()
        thread.join(timeout)
        assert not thread.is_alive(), "the server did not stop"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client(url: str, **kwargs) -> httpx.Client:
    """A plain HTTP client of the server, with no proxy from the environment in between."""
    return httpx.Client(base_url=url, trust_env=False, timeout=120, **kwargs)


def wait_for(predicate, timeout: float = 60.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None, param=...) -> dict:
    """The response is OpenAI's error object with `status` (and `code`, `param` when given),
    one line of message and no traceback; returns the error object."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"].strip(), error
    assert "\n" not in error["message"] and "Traceback" not in response.text, error
    if code is not None:
        assert error["code"] == code, error
    if param is not ...:
        assert error["param"] == param, error
    return error
