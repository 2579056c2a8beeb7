"""`specasr transcribe --server URL`: the client of a running `specasr serve`.

Each input goes to the server's OpenAI-style endpoint (`POST /v1/audio/transcriptions`, or
`/translations`) as multipart/form-data with the CLI's options under their own names; the
server decodes it with its models and answers verbose_json, with every format asked for
rendered by `specasr.writers` there (`outputs`). The batch (`cli.batch`) then writes those
texts as a local run writes its own: output names, locks, provenance, atomic files. Only the
json changes on the way: it gains the input's `source`, as a local run's does.

This module imports no torch, numpy or third-party HTTP library (stdlib `urllib` only), so a
client process starts in a fraction of the time a local run needs to import torch and load
models.
"""

from __future__ import annotations

import http.client
import json
import mimetypes
import os
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from specasr import writers
from specasr.options import DETECT_LANGUAGE, OFF_WITH_NONE, WHISPER_DEFAULTS
from specasr.stats import DecodeStats

# The options a server takes, by the CLI's names: `specasr.options.front_end_options` builds
# TranscribeOptions from them on both sides, and an option left out takes its default there,
# which is the CLI's. So only the options given are sent, and a server without a draft picks
# its own mode (autoregressive) as a local run with `--draft none` would be told to.
OPTION_FIELDS = (
    "mode",
    "temperature",
    "gamma",
    "gamma_policy",
    "draft_stop",
    "sampling",
    "language",
    "seed",
    "without_timestamps",
    "strategy",
    "batch_size",
    "vad",
    "vad_threshold",
    "vad_min_silence",
    "max_line_width",
    "max_line_count",
    "highlight_words",
    *WHISPER_DEFAULTS,  # (the initial prompt goes as OpenAI's `prompt`)
)
ENDPOINTS = {"transcribe": "/v1/audio/transcriptions", "translate": "/v1/audio/translations"}
HEALTH_TIMEOUT_S = 10.0  # a server that is up answers /health at once, whatever it is decoding
_BLOCK = 1 << 20  # bytes of audio read and sent at a time


class ServerError(Exception):
    """The server could not be reached, refused a request or gave an unexpected answer; the
    message is one line."""


class Unreachable(ServerError):
    """No HTTP answer at all: nothing listens at the URL, or it did not answer in time."""


class Refused(ServerError):
    """An HTTP error answer (`status`), its message from the server."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def server_url(url: str) -> str:
    """`--server`'s value checked and without a trailing slash; ValueError says what is wrong."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{url!r}: expected http://HOST:PORT or https://HOST[:PORT][/PATH]")
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: a server URL has no query or fragment")
    return url.rstrip("/")


def form_fields(given: dict[str, object]) -> dict[str, str]:
    """The CLI's options given on its command line, by name (from click's `ctx.params`) -> the
    form's text fields: those of OPTION_FIELDS, booleans as true/false, an automatic language
    left out, and word timestamps as OpenAI's `timestamp_granularities[]`."""
    fields = {}
    for name in OPTION_FIELDS:
        value = given.get(name)
        if name in OFF_WITH_NONE and name in given and value is None:
            value = "none"  # a threshold turned off
        if value is None or (name == "language" and value == DETECT_LANGUAGE):
            continue
        field = "prompt" if name == "initial_prompt" else name
        fields[field] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    if given.get("word_timestamps"):
        fields["timestamp_granularities[]"] = "word"
    return fields


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _quoted(name: str) -> str:
    # the HTML form encoding of a multipart filename: quotes and line breaks percent-escaped
    return name.replace("\r", "%0D").replace("\n", "%0A").replace('"', "%22")


class _AnswerFirst:
    """A connection that, when the server breaks it off while the request is still being
    sent, reads the server's answer anyway: a server refuses a request (a wrong key, a full
    queue) as soon as it has read the headers, before the file, and then closes."""

    def request(self, *args, **kwargs) -> None:
        try:
            super().request(*args, **kwargs)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the answer, if the server sent one, is read next; if not, reading says so


class _HTTPConnection(_AnswerFirst, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_AnswerFirst, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def do_open(self, http_class, req, **kwargs):
        return super().do_open(_HTTPConnection, req, **kwargs)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def do_open(self, http_class, req, **kwargs):
        return super().do_open(_HTTPSConnection, req, **kwargs)


@dataclass
class RemoteTranscript:
    """A transcript the server made: its rendered formats and what the summary needs."""

    duration: float  # seconds of audio
    stats: DecodeStats
    outputs: dict[str, str]  # format -> text, rendered by the server without a source
    texts: list[str]  # the segments' texts
    spans: list[tuple[float, float]]  # the segments' (start, end) in seconds

    def render(self, fmt: str, source: dict | None) -> str:
        text = self.outputs[fmt]
        return writers.json_with_source(text, source) if fmt == "json" else text

    def plain(self) -> str:
        return " ".join(t.strip() for t in self.texts)


class Client:
    """Sends files to the server at `url` (`server_url`) with the options in `fields`
    (`form_fields`: the CLI's names and values) and asks for `formats`; waits up to
    `timeout` seconds for each answer."""

    def __init__(
        self,
        url: str,
        fields: dict[str, str],
        formats: list[str],
        *,
        task: str = "transcribe",
        api_key: str | None = None,
        timeout: float,
    ) -> None:
        self.url, self.formats, self.timeout = url, list(formats), timeout
        self.endpoint = url + ENDPOINTS[task]
        self.fields = {**fields, "response_format": "verbose_json", "outputs": ",".join(self.formats)}
        host = urllib.parse.urlsplit(url).hostname or ""
        # a proxy named in the environment cannot reach this machine's own loopback address
        local = host == "localhost" or host.startswith("127.") or host == "::1"
        handlers = [_HTTPHandler(), _HTTPSHandler(), *([urllib.request.ProxyHandler({})] if local else [])]
        self._opener = urllib.request.build_opener(*handlers)
        self.headers = {"Accept": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def health(self) -> None:
        """Raises Unreachable unless the server answers `GET /health`. Any HTTP answer means
        something listens; one that refuses the key (401, 403) is left to the files, which
        each report it, and any other error status is not a specasr server's."""
        try:
            self._send(urllib.request.Request(self.url + "/health", headers=self.headers), HEALTH_TIMEOUT_S)
        except Refused as e:
            if e.status in (401, 403):
                return
            raise Unreachable(f"{self.url} is not a specasr server: GET /health: {e}") from None

    def transcribe(self, path: str) -> RemoteTranscript:
        """`path` transcribed by the server; ServerError says why not (OSError: unreadable)."""
        with open(path, "rb") as audio:
            size = os.fstat(audio.fileno()).st_size
            boundary = uuid.uuid4().hex
            head, tail = self._form(os.path.basename(path), boundary)
            request = urllib.request.Request(
                self.endpoint,
                data=_body(head, audio, size, tail),
                method="POST",
                headers={
                    **self.headers,
                    "Content-Type": f"multipart/form-data; boundary={boundary}",
                    "Content-Length": str(len(head) + size + len(tail)),
                },
            )
            raw = self._send(request, self.timeout)
        return self._transcript(raw)

    def _form(self, filename: str, boundary: str) -> tuple[bytes, bytes]:
        """The multipart body around the file's bytes: the text fields and the file part's
        header before, the closing boundary after."""
        parts = [
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
            for name, value in self.fields.items()
        ]
        kind = mimetypes.guess_type(filename)[0] or "application/octet-stream"
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{_quoted(filename)}"'
            f"\r\nContent-Type: {kind}\r\n\r\n"
        )
        return "".join(parts).encode(), f"\r\n--{boundary}--\r\n".encode()

    def _send(self, request: urllib.request.Request, timeout: float) -> bytes:
        try:
            with self._opener.open(request, timeout=timeout) as answer:
                return answer.read()
        except urllib.error.HTTPError as e:
            raise Refused(_error_message(e), e.code) from None
        except urllib.error.URLError as e:
            raise _unreachable(e.reason, self.url, timeout) from None
        except (OSError, http.client.HTTPException) as e:  # while the answer was read
            raise _unreachable(e, self.url, timeout) from None

    def _transcript(self, raw: bytes) -> RemoteTranscript:
        try:
            doc = json.loads(raw)
            outputs = doc["outputs"]
            missing = [fmt for fmt in self.formats if not isinstance(outputs.get(fmt), str)]
            if missing:
                raise KeyError(f"outputs[{missing[0]}]")
            return RemoteTranscript(
                duration=float(doc["duration"]),
                stats=DecodeStats.from_dict((doc.get("speculation") or {}).get("stats") or {}),
                outputs=outputs,
                texts=[s["text"] for s in doc["segments"]],
                spans=[(float(s["start"]), float(s["end"])) for s in doc["segments"]],
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ServerError(f"unexpected answer from {self.url}: {_one_line(repr(e))}") from None


def _unreachable(reason, url: str, timeout: float) -> Unreachable:
    if isinstance(reason, TimeoutError):
        return Unreachable(f"no answer from {url} within {timeout:g} s")
    if isinstance(reason, (ConnectionResetError, http.client.HTTPException)):  # it stopped, or a proxy
        return Unreachable(f"lost the connection to {url}: {_one_line(reason)}")
    return Unreachable(f"cannot reach the server at {url}: {_one_line(reason)}")  # refused, no such host


def _body(head: bytes, audio, size: int, tail: bytes) -> Iterator[bytes]:
    """The request body in blocks, so a long recording is never held in memory whole."""
    yield head
    left = size
    while left > 0:
        block = audio.read(min(_BLOCK, left))
        if not block:
            raise OSError(f"{audio.name} got shorter while it was sent")
        left -= len(block)
        yield block
    yield tail


def _error_message(e: urllib.error.HTTPError) -> str:
    """The message of an error answer: OpenAI's {"error": {"message"}}, FastAPI's
    {"detail"}, or the body's text; with the HTTP status."""
    try:
        body = e.read()
    except OSError:
        body = b""
    message = None
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        error = doc.get("error")
        if isinstance(error, dict) and error.get("message"):
            message = error["message"]
        elif isinstance(error, str):
            message = error
        elif "detail" in doc:
            detail = doc["detail"]
            message = detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False)
    if not message:
        message = body.decode("utf-8", errors="replace").strip() or e.reason or "no message"
    return f"{_one_line(message)} (HTTP {e.code})"
