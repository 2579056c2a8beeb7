"""A request's multipart/form-data body, read as it arrives: the text fields are kept in
memory, and the one file part goes straight to a file in the server's temporary directory
while its bytes are counted, so an upload over the limit is refused without being stored.
No web framework here: the body comes in as an async iterator of byte blocks."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

try:  # python-multipart >= 0.0.13 names its module python_multipart
    from python_multipart.exceptions import FormParserError
    from python_multipart.multipart import MultipartParser, parse_options_header
except ImportError:  # older releases: the same module under the name `multipart`
    from multipart.exceptions import FormParserError
    from multipart.multipart import MultipartParser, parse_options_header

from .openai_api import MIB, invalid, too_large

MAX_FIELDS = 64  # text fields in one request
MAX_FIELD_BYTES = 64 * 1024  # bytes of one text field (a prompt is at most 224 tokens)
FORM_BYTES = MAX_FIELDS * (MAX_FIELD_BYTES + 1024)  # the most a body holds besides the file
# a body over the limit by at most this much is still read to its end (and dropped), so the
# client reads the 413 instead of a connection broken while it sends; beyond, the 413 goes at once
DRAIN_BYTES = 64 * MIB
WRITE_BYTES = MIB  # file data is written in blocks of about this size, off the event loop
_SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,8}$")


@dataclass
class Upload:
    """The form's text fields, in order, and where its file is."""

    fields: list[tuple[str, str]]
    path: Path
    filename: str
    size: int  # bytes

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


class _Form:
    """python-multipart's callbacks: collects the fields and writes the file part."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory, self.max_bytes = directory, max_bytes
        self.fields: list[tuple[str, str]] = []
        self.path: Path | None = None
        self.filename = ""
        self.size = 0
        self.too_big = False
        self.ended = False  # the closing boundary came: the body is whole
        self.pending: list[bytes] = []  # file data not written yet
        self.pending_bytes = 0
        self._file = None
        self._in_file = False
        self._header, self._value = b"", b""
        self._disposition = b""
        self._name = ""
        self._data = bytearray()

    def callbacks(self) -> dict:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": lambda d, s, e: setattr(self, "_header", self._header + d[s:e]),
            "on_header_value": lambda d, s, e: setattr(self, "_value", self._value + d[s:e]),
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_end": lambda: setattr(self, "ended", True),
        }

    def on_part_begin(self) -> None:
        self._disposition, self._data, self._in_file = b"", bytearray(), False

    def on_header_end(self) -> None:
        if self._header.strip().lower() == b"content-disposition":
            self._disposition = self._value
        self._header, self._value = b"", b""

    def on_headers_finished(self) -> None:
        _, params = parse_options_header(self._disposition)
        if b"name" not in params:
            raise invalid("A multipart part has no name (Content-Disposition: form-data; name=...).")
        self._name = params[b"name"].decode("utf-8", errors="replace")
        if b"filename" not in params and self._name != "file":
            if len(self.fields) >= MAX_FIELDS:
                raise invalid(f"Too many fields (at most {MAX_FIELDS}).")
            return
        if self._name != "file":
            raise invalid(f"Unknown file field {self._name!r}: send the audio as 'file'.", self._name)
        if self.path is not None:
            raise invalid("Send one file per request.", "file")
        self.filename = params.get(b"filename", b"").decode("utf-8", errors="replace")
        suffix = m.group(0).lower() if (m := _SUFFIX.search(self.filename)) else ""
        self.path = self.directory / f"upload-{uuid.uuid4().hex}{suffix}"
        self._file = open(self.path, "xb")  # noqa: SIM115 (closed by close())
        self._in_file = True

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if not self._in_file:
            self._data += data[start:end]
            if len(self._data) > MAX_FIELD_BYTES:
                raise invalid(f"Field {self._name!r} is longer than {MAX_FIELD_BYTES} bytes.", self._name)
            return
        if self.too_big:
            return
        self.size += end - start
        if self.size > self.max_bytes:
            self.too_big, self.pending, self.pending_bytes = True, [], 0
            return
        self.pending.append(data[start:end])
        self.pending_bytes += end - start

    def on_part_end(self) -> None:
        if self._in_file:
            return
        try:
            self.fields.append((self._name, self._data.decode("utf-8")))
        except UnicodeDecodeError:
            raise invalid(f"Field {self._name!r} is not UTF-8 text.", self._name) from None

    async def flush(self) -> None:
        if self.pending and self._file is not None:
            block, self.pending, self.pending_bytes = b"".join(self.pending), [], 0
            await asyncio.to_thread(self._file.write, block)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def discard(self) -> None:
        self.close()
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()


async def read_upload(
    content_type: str,
    content_length: str | None,
    body: AsyncIterator[bytes],
    directory: Path,
    max_bytes: int,
) -> Upload:
    """The request's form, its file written into `directory`; ApiError (400 for a malformed
    or incomplete form, 413 for a file over `max_bytes`). The file is the caller's to remove."""
    kind, params = parse_options_header(content_type or "")
    if kind != b"multipart/form-data" or b"boundary" not in params:
        raise invalid(
            "Send the audio as multipart/form-data, the file in a 'file' field.",
            None,
            "invalid_content_type",
        )
    ceiling = max_bytes + FORM_BYTES + DRAIN_BYTES  # a longer body is not read at all
    if content_length and content_length.isdigit() and int(content_length) > ceiling:
        raise too_large(max_bytes)
    form = _Form(directory, max_bytes)
    parser = MultipartParser(params[b"boundary"], form.callbacks())
    received = 0
    try:
        async for block in body:
            received += len(block)
            if form.too_big:  # read on and drop, up to the ceiling
                if received > ceiling:
                    break
                continue
            parser.write(block)
            if form.pending_bytes >= WRITE_BYTES:
                await form.flush()
        if form.too_big:
            raise too_large(max_bytes)
        parser.finalize()
        if not form.ended:
            raise invalid("The multipart/form-data body ended early (no closing boundary).")
        await form.flush()
    except FormParserError as e:
        form.discard()
        raise invalid(f"Malformed multipart/form-data body: {e}.") from None
    except BaseException:
        form.discard()
        raise
    form.close()
    if form.path is None:
        raise invalid("No audio: send the file in the multipart field 'file'.", "file")
    upload = Upload(form.fields, form.path, form.filename, form.size)
    if form.size == 0:
        upload.remove()
        raise invalid("The file is empty (0 bytes).", "file")
    return upload
