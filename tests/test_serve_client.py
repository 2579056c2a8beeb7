"""`specasr transcribe --server URL`: the torch-free client of `specasr serve` (cli/remote.py).

The slow tests run the real server in this process (uvicorn on a free port, the packaged
tiny.en with draft self:2) and compare the client's outputs with a local run of the same
command: the same stdout, and the same files byte for byte, but for what is wall-clock time
(`TIMES`: the json's stage and phase seconds, and the provenance record's `written_at` and
writer `pid`)."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from specasr.cli import main
from specasr.cli.remote import OPTION_FIELDS, form_fields
from specasr.cli.transcribe import transcribe as transcribe_command
from specasr.options import TranscribeOptions, front_end_options
from specasr.results import Segment, TranscriptionInfo, Word
from specasr.stats import DecodeStats
from specasr.writers import FORMATS, json_with_source, render_json

REPO = Path(__file__).resolve().parents[1]
LOCAL = ["--model", "tiny.en", "--draft", "self:2"]  # the pair the test server loads
# json stats that are wall-clock seconds, different in every run
TIMES = ("encoder_s", "decoder_s", "draft_s", "target_s", "verify_s", "window_s", "verify_times")


def _invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(main, ["transcribe", *args], catch_exceptions=False, env=env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- fast: no server, or a stub that answers what a test needs ------------------------------
def test_options_left_out_take_the_clis_defaults_on_the_server():
    """The client sends only the options given; the server builds the rest with
    front_end_options' defaults, which must be the CLI's own."""
    ctx = click.Context(transcribe_command)
    cli = {p.name: p.get_default(ctx) for p in transcribe_command.params}
    defaults = inspect.signature(front_end_options).parameters
    assert set(OPTION_FIELDS) <= set(cli)
    assert [name for name in OPTION_FIELDS if name in defaults and cli[name] != defaults[name].default] == []
    assert form_fields({}) == {}
    given = {"mode": "exact", "vad": True, "without_timestamps": False, "gamma": 3, "draft_stop": 0.5}
    assert form_fields({**given, "language": "auto", "max_line_width": None, "word_timestamps": True}) == {
        "mode": "exact",
        "gamma": "3",
        "draft_stop": "0.5",
        "without_timestamps": "false",
        "vad": "true",
        "timestamp_granularities[]": "word",
    }


def test_stats_read_back_from_their_dict():
    stats = DecodeStats(encoder_s=0.25, decoder_s=1.5, verify_times=[0.001])
    stats.record_pass(3, [1, 3], [2, 4], stopped=True)
    stats.record_step(2)
    doc = json.loads(json.dumps(stats.to_dict()))  # through JSON, as a server sends it
    assert DecodeStats.from_dict(doc) == stats
    assert DecodeStats.from_dict({**doc, "added_later": 1}) == stats
    assert DecodeStats.from_dict({}) == DecodeStats()


def test_a_servers_json_gets_the_source_a_local_run_writes():
    options = TranscribeOptions()
    stats = DecodeStats(encoder_s=0.1)
    words = [Word(" Élinor,", 0.0, 0.4, 0.91234), Word(" oui", 0.5, 1.0, 0.5)]
    segments = [
        Segment(0, 0.0, 1.0, " Élinor, oui", [1, 2], -0.2, 1.1, 0.01, 0.0, 0, stats, words=words),
        Segment(1, 1.0, 2.5, ' "quoted"\t1/3', [3], -1 / 3, 2.0, 1e-7, 0.2, 1, stats),
    ]
    info = TranscriptionInfo("fr", True, 2.5, options, "tiny", "self:2", stats, 2)
    source = {"path": "/data/ä b.wav", "size": 123, "mtime_ns": 1700000000123456789}
    served = render_json(segments, info)
    assert json_with_source(served, source) == render_json(segments, info, source)
    assert json_with_source(served, None) == served


@pytest.mark.parametrize(
    "option",
    [
        ["--model", "tiny.en"],
        ["--draft", "self:2"],
        ["--device", "cpu"],
        ["--dtype", "fp32"],
        ["--compute-type", "int8"],
        ["--ray"],
        ["--workers", "2"],
    ],
)
def test_model_options_with_server_are_usage_errors(option, librivox):
    """The server's models are fixed when it starts: a model option would be ignored, so it
    is refused (exit 2) before anything is sent; nothing listens at this URL."""
    result = _invoke(str(librivox[0].path), "--server", "http://127.0.0.1:9", *option)
    assert result.exit_code == 2
    assert f"{option[0]} cannot be used with --server" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--server", "127.0.0.1:8000"], "expected http://HOST:PORT"),
        (["--api-key", "k"], "go with --server"),
        (["--timeout", "5"], "go with --server"),
        (["--server", "http://127.0.0.1:9", "--language", "xx"], "unknown language 'xx'"),
    ],
)
def test_server_usage_errors_exit_2(args, message, librivox):
    result = _invoke(str(librivox[0].path), *args)
    assert result.exit_code == 2 and message in result.stderr


def test_an_unreachable_server_is_one_line_and_exit_1(librivox, tmp_path):
    """Checked once (GET /health) before any input is read: one line for the whole run,
    nothing about the inputs, no outputs."""
    url = f"http://127.0.0.1:{_free_port()}"
    result = _invoke(str(librivox[0].path), "missing.wav", "--server", url, "-o", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: cannot reach the server at {url}: [Errno 111] Connection refused"
    ]
    assert result.stdout == "" and list((tmp_path / "out").iterdir()) == []


class _Stub(BaseHTTPRequestHandler):
    """Answers /health, and every POST with the class's `answer` (status, body, delay)."""

    answer: tuple[int, bytes, float] = (200, b"{}", 0.0)

    def do_GET(self):
        self._send(200, b'{"status": "ok"}')

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        status, body, delay = self.answer
        time.sleep(delay)
        self._send(status, body)

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class _StubServer(ThreadingHTTPServer):
    daemon_threads = False  # server_close waits for the handlers: none writes into a later test's output

    def handle_error(self, request, client_address) -> None:
        pass  # a client that gave up waiting broke the connection: what the timeout test wants


@pytest.fixture
def stub():
    _Stub.answer = (200, b"{}", 0.0)
    server = _StubServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (
            401,
            {"error": {"message": "Incorrect API key", "type": "x", "param": None, "code": None}},
            "Incorrect API key (HTTP 401)",
        ),
        (422, {"detail": [{"loc": ["body", "file"], "msg": "Field required"}]}, "Field required"),
        (502, "Bad Gateway\n<html>", "Bad Gateway <html> (HTTP 502)"),
        (200, {"text": "no outputs"}, "unexpected answer from http://127.0.0.1:"),
    ],
)
def test_each_file_reports_the_servers_error_on_one_line(stub, librivox, status, body, message):
    _Stub.answer = (status, body.encode() if isinstance(body, str) else json.dumps(body).encode(), 0.0)
    paths = [str(c.path) for c in librivox[:2]]
    result = _invoke(*paths, "--server", f"http://127.0.0.1:{stub.server_port}")
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert [e.split(": ", 2)[1] for e in errors] == paths and all(message in e for e in errors), errors
    assert "files: 0 done, 0 skipped, 2 failed" in result.stderr


def test_a_server_that_does_not_answer_in_time_fails_the_file(stub, librivox):
    _Stub.answer = (200, b"{}", 1.5)
    url = f"http://127.0.0.1:{stub.server_port}"
    result = _invoke(str(librivox[0].path), "--server", url, "--timeout", "0.3")
    assert result.exit_code == 1
    assert f"error: {librivox[0].path}: no answer from {url} within 0.3 s" in result.stderr


# ---- slow: the real server, in this process -----------------------------------------------
@pytest.fixture(scope="module")
def served_pair():
    from specasr.models.loading import load_pair

    return load_pair("tiny.en", "self:2", device="cpu")


def _serving(pair, **settings):
    """`specasr serve`'s app over `pair`, served in this process (tests/serve_helpers.py)."""
    from serve_helpers import serving
    from specasr.apps.server import ServerSettings, create_app

    return serving(create_app(pair, ServerSettings(**settings)))


@pytest.fixture(scope="module")
def server(served_pair):
    with _serving(served_pair) as running:
        yield running.url


def _without_times(text: str) -> dict:
    doc = json.loads(text)
    for key in TIMES:
        doc["stats"].pop(key)
    return doc


def _outputs(folder: Path) -> dict[str, object]:
    """Every file under `folder` by relative path: the text, or the parsed json without
    its wall-clock values."""
    found = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        text = path.read_text(encoding="utf-8")
        if path.name.endswith(".specasr.json"):  # the provenance record: when and by which process
            doc = json.loads(text)
            for record in doc["outputs"].values():
                assert record.pop("written_at") > 0 and record.pop("pid") > 0
            found[str(path.relative_to(folder))] = doc
        elif path.suffix == ".json":
            found[str(path.relative_to(folder))] = _without_times(text)
        else:
            found[str(path.relative_to(folder))] = text
    return found


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["txt", "json"])
def test_one_file_prints_what_a_local_run_prints(server, librivox, fmt):
    clip = str(librivox[0].path)
    remote = _invoke(clip, "--format", fmt, "--server", server)
    local = _invoke(clip, "--format", fmt, *LOCAL)
    assert remote.exit_code == local.exit_code == 0, remote.output
    if fmt == "json":  # the json names its source, as a local run's does
        assert _without_times(remote.stdout) == _without_times(local.stdout)
        assert json.loads(remote.stdout)["source"]["path"] == os.path.abspath(clip)
    else:
        assert remote.stdout == local.stdout and remote.stdout.strip()
    assert remote.stderr.startswith("files: 1 done, 0 skipped, 0 failed; audio 7.1 s")


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [[], ["--word-timestamps", "--max-line-width", "16", "--max-line-count", "2", "--gamma", "3"]],
    ids=["defaults", "words"],
)
def test_every_format_is_the_local_runs_file(server, librivox, tmp_path, options):
    """Two clips in two folders (the -o tree), every format, the same bytes but the times."""
    for i, clip in enumerate(librivox[:2]):
        (tmp_path / "in" / f"d{i}").mkdir(parents=True)
        shutil.copy(clip.path, tmp_path / "in" / f"d{i}" / "clip.wav")
    inputs = [str(tmp_path / "in" / f"d{i}" / "clip.wav") for i in range(2)]
    remote = _invoke(*inputs, "--format", "all", "-o", str(tmp_path / "r"), "--server", server, *options)
    local = _invoke(*inputs, "--format", "all", "-o", str(tmp_path / "l"), *LOCAL, *options)
    assert remote.exit_code == local.exit_code == 0, remote.output
    written = _outputs(tmp_path / "r")
    assert sorted(written) == sorted(
        [f"d{i}/clip.{fmt}" for i in range(2) for fmt in FORMATS]
        + [f"d{i}/.clip.specasr.json" for i in range(2)]
    )
    assert written == _outputs(tmp_path / "l")
    if options:
        assert "words" in written["d0/clip.json"]["segments"][0]


@pytest.mark.slow
def test_skip_existing_skips_what_the_server_wrote(server, librivox, tmp_path):
    """A second run skips outputs made from the same files, through the server or locally:
    the provenance records are the same."""
    inputs = [str(c.path) for c in librivox[:2]]
    out = tmp_path / "out"
    first = _invoke(*inputs, "--format", "srt", "-o", str(out), "--server", server)
    assert first.exit_code == 0 and "files: 2 done, 0 skipped, 0 failed" in first.stderr
    stamps = {p: p.stat().st_mtime_ns for p in out.iterdir()}
    again = _invoke(*inputs, "--format", "srt", "-o", str(out), "--server", server, "--skip-existing")
    assert again.exit_code == 0 and "files: 0 done, 2 skipped, 0 failed" in again.stderr
    local = _invoke(*inputs, "--format", "srt", "-o", str(out), *LOCAL, "--skip-existing")
    assert local.exit_code == 0 and "files: 0 done, 2 skipped, 0 failed" in local.stderr
    assert {p: p.stat().st_mtime_ns for p in out.iterdir()} == stamps


@pytest.mark.slow
def test_a_bad_file_is_reported_and_the_others_are_done(server, librivox, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for clip in librivox[:2]:
        shutil.copy(clip.path, folder / clip.path.name)
    (folder / "broken.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt garbage")
    out = tmp_path / "out"
    result = _invoke(str(folder), "-o", str(out), "--server", server, "--stats")
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {folder / 'broken.wav'}: "), result.stderr
    assert "files: 2 done, 0 skipped, 1 failed" in result.stderr and "1 of 3 file(s) failed" in result.stderr
    assert result.stderr.count("α̂=") == 2  # --stats: the server's statistics of each good file
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        f"{c.path.stem}.txt" for c in librivox[:2]
    )


@pytest.mark.slow
def test_several_inputs_print_a_line_each_as_a_local_run_does(server, librivox):
    inputs = [str(c.path) for c in librivox[:3]]
    remote = _invoke(*inputs, "--server", server)
    local = _invoke(*inputs, *LOCAL)
    assert remote.exit_code == local.exit_code == 0
    assert remote.stdout == local.stdout and len(remote.stdout.splitlines()) == 3


@pytest.mark.slow
def test_a_server_with_a_key_turns_away_a_wrong_one(served_pair, librivox):
    """The server answers a wrong key before it reads the file: each file still reports
    the server's message, and the right key from $SPECASR_API_KEY gets the transcript."""
    with _serving(served_pair, api_key="right") as running:
        inputs = [str(c.path) for c in librivox[:2]]
        wrong = _invoke(*inputs, "--server", running.url, "--api-key", "wrong")
        assert wrong.exit_code == 1 and "files: 0 done, 0 skipped, 2 failed" in wrong.stderr
        errors = [line for line in wrong.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 2 and all("(HTTP 401)" in e for e in errors), wrong.stderr
        right = _invoke(inputs[0], "--server", running.url, env={"SPECASR_API_KEY": "right"})
        assert right.exit_code == 0 and right.stdout.strip()


@pytest.mark.slow
def test_the_client_process_imports_no_torch(server, librivox):
    """A fresh process runs the command against the server: the transcript comes back, and
    neither torch nor the decoding code nor a progress bar's module was imported."""
    probe = (
        "import sys\n"
        "from specasr.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "finally:\n"
        # and nothing a client does without: tqdm (no terminal here), torch's package metadata
        "    heavy = ('torch', 'fastapi', 'specasr.transcription', 'specasr.models.loading',\n"
        "             'tqdm', 'importlib.metadata')\n"
        "    print('loaded:', [m for m in heavy if m in sys.modules], file=sys.stderr)\n"
    )
    clip = str(librivox[0].path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-c", probe, "transcribe", clip, "--server", server],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "loaded: []" in run.stderr
    assert run.stdout == _invoke(clip, "--server", server).stdout and run.stdout.strip()
