"""`python -m benchmarks.serve_load`: its maths, its tables, its requests (against a stub
server), and, slow, one tiny run against `specasr serve`."""

from __future__ import annotations

import email
import email.policy
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.util import find_spec
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from benchmarks.docs_check import check_command
from benchmarks.serve_load import (
    Clip,
    Done,
    Level,
    input_paths,
    load_table,
    main,
    multipart,
    parse_clients,
    percentile,
    process_table,
    run_level,
    summarise,
    whole_table,
)

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"


def test_client_levels_are_parsed_sorted_and_checked():
    assert parse_clients("16,1,4") == [1, 4, 16]
    assert parse_clients("2, 2,") == [2]
    for bad in ("0,4", "a", ""):
        with pytest.raises(click.BadParameter):
            parse_clients(bad)


def test_the_full_measurements_command_line_parses():
    full = (
        "python -m benchmarks.serve_load --model base --draft default --compute-type int8 "
        "--clients 1,4,16 --requests 48 --corpus /tmp/corpus/heldout --per-source 16 "
        "--whole-process --repeats 5"
    )
    assert check_command(full) is None
    assert "no such option" in check_command("python -m benchmarks.serve_load --client 4").lower()


@pytest.mark.parametrize("n", [1, 2, 7, 20])
def test_percentiles_are_numpys_linear_ones(n):
    values = [random.Random(n).uniform(0, 10) for _ in range(n)]
    for q in (0, 50, 95, 100):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5


def clips(*seconds: float) -> list[Clip]:
    return [Clip(f"c{i}.wav", s, b"") for i, s in enumerate(seconds)]


def test_a_levels_row_is_audio_over_wall_and_its_latency_percentiles():
    """Three requests of a 10 s and a 20 s clip in 8 s of wall: 40 s of audio, 5 audio s/s;
    a response counts as the library's only if it is the same string."""
    level = Level(2, wall=8.0, done=[Done(0, 2.0, "a b"), Done(1, 4.0, "c"), Done(0, 3.0, "a  b")])
    row = summarise(level, clips(10.0, 20.0), ["a b", "c"])
    assert row["audio_s"] == 40.0 and row["rate"] == 5.0 and row["requests"] == 3
    assert row["p50_s"] == 3.0 and row["p95_s"] == pytest.approx(3.9)
    assert row["same"] == 2 and row["differ"] == [{"path": "c0.wav", "server": "a  b", "library": "a b"}]
    assert row["texts"] == {"c0.wav": "a b", "c1.wav": "c"}  # each file's first response
    assert row["latencies_s"] == [2.0, 4.0, 3.0]


def test_the_tables_compare_with_their_first_row():
    rows = [
        {
            "clients": c,
            "requests": 4,
            "audio_s": 40.0,
            "wall_s": w,
            "rate": 40.0 / w,
            "p50_s": 1,
            "p95_s": 2,
            "same": s,
        }
        for c, w, s in ((1, 8.0, 4), (4, 2.0, 3))
    ]
    load = load_table(rows).splitlines()
    assert len(load) == 4 and "vs 1 client(s)" in load[0]
    assert "| 1.00× |" in load[2] and "| 4.00× |" in load[3] and load[3].endswith("| 3/4 |")
    procs = [{"name": "lib", "files": 2, "audio_s": 30.0, "wall_s": w, "rate": 30.0 / w} for w in (6.0, 3.0)]
    assert process_table(procs).splitlines()[-1].endswith("| 10.00 | 2.00× |")
    whole = [
        {"clip": "x.wav", "names": ["local", "remote"], "walls": [[3, 2, 4], [1, 1, 2]], "rss": [[500], [60]]}
    ]
    local, remote = whole_table(whole).splitlines()[2:]
    assert "| 3.00 | 2.00 – 4.00 | 500 | 1.00× |" in local and "| 1.00 | 1.00 – 2.00 | 60 | 3.00× |" in remote


def test_the_multipart_body_parses_back_to_its_fields_and_file():
    data = bytes(range(256)) * 3  # every byte value, CR and LF included
    body, content_type = multipart({"model": "whisper-1", "response_format": "verbose_json"}, "a.wav", data)
    message = email.message_from_bytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body, policy=email.policy.HTTP
    )
    parts = {p.get_param("name", header="content-disposition"): p for p in message.iter_parts()}
    assert parts["model"].get_content() == "whisper-1"
    assert parts["response_format"].get_content() == "verbose_json"
    assert parts["file"].get_filename() == "a.wav" and parts["file"].get_content() == data


class Stub(BaseHTTPRequestHandler):
    """Answers a transcription request with its file's name after a short wait, counting
    requests in flight; a file named fail.wav gets HTTP 500."""

    lock = threading.Lock()
    in_flight = peak = 0

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        message = email.message_from_bytes(
            f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode() + body, policy=email.policy.HTTP
        )
        name = next(p.get_filename() for p in message.iter_parts() if p.get_filename())
        with Stub.lock:
            Stub.in_flight += 1
            Stub.peak = max(Stub.peak, Stub.in_flight)
        time.sleep(0.05)
        with Stub.lock:
            Stub.in_flight -= 1
        status, reply = (500, {"error": "boom"}) if name == "fail.wav" else (200, {"text": name})
        payload = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Stub.peak = 0
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_level_sends_every_request_once_from_that_many_clients(stub_url):
    files = clips(1.0, 2.0, 3.0)
    level = run_level(stub_url, files, clients=3, requests=7, language=None)
    assert len(level.done) == 7 and Stub.peak == 3  # all three clients were busy at once
    assert sorted(d.clip for d in level.done) == [0, 0, 0, 1, 1, 2, 2]  # request i -> clip i mod 3
    assert all(d.text == f"c{d.clip}.wav" and 0.05 <= d.latency < level.wall for d in level.done)
    assert level.wall >= 3 * 0.05  # 7 requests over 3 clients: at least three rounds


def test_a_failed_request_stops_the_level_with_the_servers_answer(stub_url):
    with pytest.raises(RuntimeError, match="HTTP 500.*boom"):
        run_level(stub_url, [Clip("fail.wav", 1.0, b"")], clients=2, requests=4, language="en")


def test_inputs_are_globs_in_order_or_a_sources_corpus_windows(tmp_path):
    from conftest import write_corpus

    wavs = sorted(DATA.glob("*.wav"))
    got = input_paths((str(DATA / "*0870.wav"), str(DATA / "*.wav")), "", "", 0)
    assert got == [str(wavs[0])] + [str(w) for w in wavs[1:]]  # each file once, first mention first
    rows = [
        (wavs[0], "b:en", None),
        (wavs[1], "a:en", None),
        (wavs[2], "a:en", None),
        (wavs[3], "a:en", None),
    ]
    corpus = write_corpus(tmp_path / "heldout", rows)
    picked = input_paths((), str(corpus), "a:en", 2)
    assert picked == [str(corpus / "audio" / wavs[1].name), str(corpus / "audio" / wavs[2].name)]
    with pytest.raises(click.BadParameter, match="no windows"):
        input_paths((), str(corpus), "c:en", 2)
    with pytest.raises(click.BadParameter, match="corpus.jsonl"):
        input_paths((), str(tmp_path / "missing"), "a:en", 2)


@pytest.mark.slow  # tiny.en served and loaded here: two short clips, 1 and 2 clients
@pytest.mark.skipif(find_spec("specasr.cli.serve") is None, reason="`specasr serve` is not in this checkout")
def test_a_tiny_run_gives_the_librarys_text_at_every_level():
    files = [str(p) for p in sorted(DATA.glob("*.wav"))[1:3]]
    args = ["--model", "tiny.en", "--draft", "self:2", "--clients", "1,2", "--requests", "2"]
    result = CliRunner().invoke(
        main, [*args, "--files", files[0], "--files", files[1], "--no-faster-whisper"]
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.output.strip().splitlines()[-1])
    assert record["identical"] == [4, 4] and record["server_exit"] == 0
    assert [r["clients"] for r in record["levels"]] == [1, 2]
    assert all(t.strip() for t in record["texts"].values())
