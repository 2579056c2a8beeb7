"""`specasr serve` (apps/server.py and apps/serve_*.py, apps/openai_api.py, cli/serve.py):
OpenAI's audio API over one model pair, with the CLI's options and transcripts.

The fast tier checks the fields and every error answer on a random tiny pair; the slow tier
serves the packaged tiny.en to the official `openai` client, checks concurrent requests
against `specasr transcribe`, and stops a real `specasr serve` process with SIGTERM."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile as sf
import torch
from click.testing import CliRunner
from conftest import with_self_draft
from serve_helpers import assert_openai_error, client, free_port, serving, wait_for
from specasr.apps import serve_work
from specasr.apps.openai_api import RESPONSE_FORMATS, ApiError, Served, ServerSettings, parse_request
from specasr.apps.serve_work import finite
from specasr.apps.server import create_app
from tiny_pairs import random_tiny_pair

from specasr.cli import main
from specasr.longform.engine import SharedEngine
from specasr.options import front_end_options
from specasr.tokenizer import LANGUAGE_NAMES, LANGUAGES
from specasr.writers import SubtitleOptions

ROOT = Path(__file__).resolve().parents[1]
KEY = "test-key"
EN = Served(("tiny.en", "whisper-1"), True, False, frozenset({"en"}))
MULTI = Served(("base", "whisper-1"), True, True, frozenset(LANGUAGES))
NO_DRAFT = Served(("base", "whisper-1"), False, True, frozenset(LANGUAGES))


def _wav(seconds: float, rate: int = 16000, seed: int = 0) -> bytes:
    """Quiet noise as 16-bit wav bytes."""
    noise = np.random.default_rng(seed).standard_normal(int(seconds * rate)).astype(np.float32) * 0.01
    buf = io.BytesIO()
    sf.write(buf, noise, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _silent_flac(seconds: int, rate: int = 48000, channels: int = 2, stated: bool = True) -> bytes:
    """A few KiB of FLAC that decodes to `seconds` of audio; `stated` False zeroes the
    header's length, so only decoding can tell how long it is."""
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", rate, channels, format="FLAC", subtype="PCM_16") as f:
        block = np.zeros((rate * 10, channels), np.int16)
        for _ in range(seconds // 10):
            f.write(block)
    data = bytearray(buf.getvalue())
    if not stated:  # STREAMINFO's 36-bit total-samples field: the low nibble of byte 21, bytes 22-25
        data[21] &= 0xF0
        data[22:26] = bytes(4)
    return bytes(data)


# ---- fields -> options (no server) ---------------------------------------------------------
def test_a_request_without_fields_gets_the_clis_defaults():
    job = parse_request([], "transcribe", EN)
    assert job.options == front_end_options()
    assert (job.response_format, job.outputs, job.words) == ("json", (), False)
    assert job.subtitles == SubtitleOptions()


def test_every_field_reaches_the_options_under_the_clis_name():
    items = [
        ("mode", "baseline"),
        ("gamma", "3"),
        ("gamma_policy", "fixed"),
        ("draft_stop", "0"),
        ("strategy", "chunked"),
        ("batch_size", "4"),
        ("vad", "true"),
        ("vad_threshold", "0.4"),
        ("vad_min_silence", "0.5"),
        ("seed", "7"),
        ("without_timestamps", "1"),
        ("temperature", "0.2"),
        ("language", "de"),
        ("prompt", "Hello."),
        ("timestamp_granularities[]", "segment"),
        ("timestamp_granularities[]", "word"),
        ("max_line_width", "20"),
        ("max_line_count", "2"),
        ("highlight_words", "true"),
        ("response_format", "verbose_json"),
        ("outputs", "srt, txt,srt"),
        ("model", "whisper-1"),
        ("stream", "false"),
    ]
    job = parse_request(items, "translate", MULTI)
    assert job.options == front_end_options(
        mode="baseline",
        gamma=3,
        gamma_policy="fixed",
        draft_stop=0.0,
        strategy="chunked",
        batch_size=4,
        vad=True,
        vad_threshold=0.4,
        vad_min_silence=0.5,
        seed=7,
        without_timestamps=True,
        temperature=0.2,
        language="de",
        task="translate",
        word_timestamps=True,
        initial_prompt="Hello.",
    )
    assert job.subtitles == SubtitleOptions(20, 2, True)
    assert (job.outputs, job.words, job.task) == (("srt", "txt"), True, "translate")


def test_a_server_without_a_draft_decodes_autoregressively_unless_asked_to_speculate():
    assert parse_request([], "transcribe", NO_DRAFT).options.decode.mode == "autoregressive"
    with pytest.raises(ApiError, match="needs a draft") as e:
        parse_request([("mode", "exact")], "transcribe", NO_DRAFT)
    assert (e.value.status, e.value.param) == (400, "mode")


@pytest.mark.parametrize(
    "items, served, status, param, code",
    [
        ([("foo", "1")], EN, 400, "foo", "unknown_parameter"),
        ([("stream", "true")], EN, 400, "stream", "unsupported_parameter"),
        ([("chunking_strategy", "auto")], EN, 400, "chunking_strategy", "unsupported_parameter"),
        ([("include[]", "logprobs")], EN, 400, "include[]", "unsupported_parameter"),
        ([("model", "gpt-4o-transcribe")], EN, 404, "model", "model_not_found"),
        ([("response_format", "xml")], EN, 400, "response_format", "invalid_value"),
        ([("gamma", "0")], EN, 400, "gamma", "invalid_value"),
        ([("gamma", "two")], EN, 400, "gamma", "invalid_value"),
        ([("gamma", "17")], EN, 400, "gamma", "invalid_value"),  # the CLI's bound, 16
        ([("temperature", "1.5")], EN, 400, "temperature", "invalid_value"),  # OpenAI's 0–1
        ([("temperature", "nan")], EN, 400, "temperature", "invalid_value"),
        ([("draft_stop", "1")], EN, 400, "draft_stop", "invalid_value"),
        ([("vad", "maybe")], EN, 400, "vad", "invalid_value"),
        ([("seed", "-1")], EN, 400, "seed", "invalid_value"),
        ([("mode", "exact"), ("mode", "baseline")], EN, 400, "mode", "invalid_value"),
        ([("timestamp_granularities[]", "char")], EN, 400, "timestamp_granularities[]", "invalid_value"),
        ([("max_line_width", "20")], EN, 400, "max_line_width", "invalid_value"),
        ([("highlight_words", "true")], EN, 400, "highlight_words", "invalid_value"),
        (
            [("timestamp_granularities[]", "word"), ("max_line_count", "2")],
            EN,
            400,
            "max_line_count",
            "invalid_value",
        ),
        ([("outputs", "txt")], EN, 400, "outputs", "invalid_value"),
        ([("outputs", "txt,doc"), ("response_format", "verbose_json")], EN, 400, "outputs", "invalid_value"),
        ([("language", "de")], EN, 400, "language", "invalid_value"),
        ([("language", "xx")], MULTI, 400, "language", "invalid_value"),
    ],
)
def test_a_bad_field_is_an_error_naming_it(items, served, status, param, code):
    with pytest.raises(ApiError) as e:
        parse_request(items, "transcribe", served)
    assert (e.value.status, e.value.param, e.value.code) == (status, param, code), e.value.message
    assert e.value.body()["error"]["message"] == e.value.message and "\n" not in e.value.message


def test_an_english_only_model_cannot_translate():
    with pytest.raises(ApiError, match="English-only and cannot translate") as e:
        parse_request([], "translate", EN)
    assert e.value.status == 400


def test_every_language_code_has_openais_name_and_json_gets_no_infinities():
    assert list(LANGUAGE_NAMES) == list(LANGUAGES)
    assert (LANGUAGE_NAMES["en"], LANGUAGE_NAMES["ht"], LANGUAGE_NAMES["yue"]) == (
        "english",
        "haitian creole",
        "cantonese",
    )
    assert finite({"a": [float("-inf"), 1.5], "b": float("nan"), "c": "x"}) == {
        "a": [None, 1.5],
        "b": None,
        "c": "x",
    }


@pytest.mark.parametrize(
    "change",
    [
        {"max_concurrent": 0},
        {"max_queue": -1},
        {"max_batch": 0},
        {"max_upload_mb": 0},
        {"max_seconds": float("inf")},
        {"request_timeout": float("nan")},
        {"api_key": " "},
    ],
)
def test_settings_are_checked(change):
    with pytest.raises(ValueError, match=next(iter(change))):
        ServerSettings(**change)


# ---- the command line -------------------------------------------------------------------------
@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-concurrent", "0"], "max_concurrent must be"),
        (["--max-queue", "-1"], "max_queue must be"),
        (["--max-upload-mb", "0"], "max_upload_mb must be"),
        (["--request-timeout", "nan"], "request_timeout must be"),
        (["--api-key", ""], "api_key must not be empty"),
        (["--draft", "self:x"], "expected self:K"),
        (["--port", "70000"], "70000"),
        (["--port", "BUSY"], "cannot listen on 127.0.0.1:"),
    ],
)
def test_serve_usage_errors_exit_2_before_any_model_loads(monkeypatch, busy_port, args, message):
    def load_models(*a, **k):
        raise AssertionError("a model loaded before the options were checked")

    monkeypatch.setattr("specasr.cli.serve.load_models", load_models)
    monkeypatch.delenv("SPECASR_API_KEY", raising=False)
    args = [str(busy_port) if a == "BUSY" else a for a in args]
    result = CliRunner().invoke(main, ["serve", "--model", "tiny.en", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_serve_help_imports_neither_torch_nor_the_web_framework():
    probe = (
        "import sys\nfrom specasr.cli import main\n"
        "print(*(m in sys.modules for m in ('torch', 'fastapi', 'uvicorn')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False", "False"]


# ---- every error answer, on a random tiny pair ------------------------------------------------
@pytest.fixture(scope="module")
def random_pair():
    """A random tiny pair whose transcriptions decode at most 4 tokens a window and never fall
    back: a random model talks until its token limit, at every temperature of the schedule."""
    pair = random_tiny_pair(seed=0, tokenizer="tiny.en")
    real = serve_work.transcribe

    def short(audio, p, options, **kwargs):
        if p is pair:
            options = replace(
                options.with_decode(max_new_tokens=4), temperatures=(options.decode.temperature,)
            )
        return real(audio, p, options, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serve_work, "transcribe", short)
        yield pair


def _probe(n: int) -> dict:  # a route FastAPI validates: its 422 must be OpenAI's shape too
    return {"n": n}


def test_serve_threads_are_set_before_the_load_and_kept_by_the_engine_thread(monkeypatch, random_pair):
    """`specasr serve --threads N`, as faster-whisper's `cpu_threads`: the engine thread, started
    after the load, decodes on N threads too."""
    from specasr.apps import server as server_module

    monkeypatch.setattr("specasr.cli.common.pair_loader", lambda *a, **k: lambda: random_pair)
    seen = {}

    def run(app, host, port):  # instead of serving: what the engine thread runs on, then shut down
        seen["engine"] = app.state.engine.run(torch.get_num_threads)
        seen["main"] = torch.get_num_threads()
        app.state.service._close()

    monkeypatch.setattr(server_module, "serve", run)
    before = torch.get_num_threads()
    try:
        result = CliRunner().invoke(main, ["serve", "--model", "tiny.en", "--threads", "1", "--port", "0"])
    finally:
        torch.set_num_threads(before)
    assert result.exit_code == 0, result.output
    assert seen == {"engine": 1, "main": 1}


@pytest.fixture(scope="module")
def guarded(random_pair):
    settings = ServerSettings(model="random", api_key=KEY, max_upload_mb=0.5, max_seconds=60)
    app = create_app(random_pair, settings)
    app.add_api_route("/probe/{n}", _probe)
    with serving(app) as running:
        yield running


AUTH = {"Authorization": f"Bearer {KEY}"}
TRANSCRIBE = "/v1/audio/transcriptions"
ERRORS = {  # name: (request, status, code, param)
    "random bytes": (dict(files={"file": ("a.wav", os.urandom(4000))}), 400, "invalid_audio", "file"),
    "empty file": (dict(files={"file": ("a.wav", b"")}), 400, "invalid_value", "file"),
    "no file": (dict(data={"model": "random"}, files={"x": ("x", b"")}), 400, "invalid_value", "x"),
    "only fields": (dict(data={"model": "random"}, files={}), 400, "invalid_content_type", None),
    "not a form": (dict(json={"model": "random"}), 400, "invalid_content_type", None),
    "over the size limit": (
        dict(files={"file": ("a.wav", os.urandom(600_000))}),
        413,
        "file_too_large",
        "file",
    ),
    "a bomb by its header": (
        dict(files={"file": ("b.flac", _silent_flac(300))}),
        413,
        "audio_too_long",
        "file",
    ),
    "a bomb without a length": (
        dict(files={"file": ("b.flac", _silent_flac(300, stated=False))}),
        413,
        "audio_too_long",
        "file",
    ),
    "no key": (dict(files={"file": ("a.wav", _wav(1))}, headers={}), 401, "invalid_api_key", None),
    "wrong key": (
        dict(files={"file": ("a.wav", _wav(1))}, headers={"Authorization": "Bearer nope"}),
        401,
        "invalid_api_key",
        None,
    ),
    "unknown field": (
        dict(files={"file": ("a.wav", _wav(1))}, data={"num_beams": "5"}),  # HF's name: beam_size here
        400,
        None,
        "num_beams",
    ),
    "streaming": (dict(files={"file": ("a.wav", _wav(1))}, data={"stream": "true"}), 400, None, "stream"),
    "wrong model": (
        dict(files={"file": ("a.wav", _wav(1))}, data={"model": "tiny"}),
        404,
        "model_not_found",
        "model",
    ),
    "translate on English-only": (
        dict(url="/v1/audio/translations", files={"file": ("a.wav", _wav(1))}),
        400,
        None,
        None,
    ),
    "unknown path": (dict(method="GET", url="/v1/nope"), 404, "unknown_url", None),
    "wrong method": (dict(method="GET", url=TRANSCRIBE), 405, "method_not_allowed", None),
    "FastAPI's validation": (dict(method="GET", url="/probe/abc"), 422, "invalid_value", "n"),
    "models without a key": (dict(method="GET", url="/v1/models", headers={}), 401, "invalid_api_key", None),
    "an unknown model's object": (dict(method="GET", url="/v1/models/x"), 404, "model_not_found", "model"),
}


SAYS = {  # what the limits' errors tell the client
    "over the size limit": "larger than this server takes (0.5 MiB)",
    "a bomb by its header": "The audio is 300.0 s long; this server takes up to 60 s.",
    "a bomb without a length": "The audio is longer than this server takes (60 s).",
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_every_error_is_openais_error_object(guarded, name):
    spec, status, code, param = ERRORS[name]
    spec = {"method": "POST", "url": TRANSCRIBE, "headers": AUTH} | spec
    with client(guarded.url) as http:
        response = http.request(**spec)
    error = assert_openai_error(response, status, code, param)
    assert SAYS.get(name, "") in error["message"]
    temp_dir = guarded.app.state.temp_dir
    wait_for(lambda: not any(temp_dir.iterdir()), 10, "the upload to be removed")


def test_a_random_model_answers_and_lists_itself(guarded):
    with client(guarded.url, headers=AUTH) as http:
        answer = http.post(TRANSCRIBE, files={"file": ("a.wav", _wav(2))}, data={"mode": "exact"})
        assert answer.status_code == 200, answer.text
        assert set(answer.json()) == {"text"}
        models = http.get("/v1/models").json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == ["random", "random-tiny-0", "whisper-1"]
        assert http.get("/v1/models/whisper-1").json()["object"] == "model"
        health = http.get("/health", headers={}).json()
    assert health == {"status": "ok", "model": "random", "draft": "random-tiny-1", "running": 0, "queued": 0}


def _post(url: str, results: dict, name: str, data: dict | None = None) -> None:
    with client(url) as http:
        results[name] = http.post(TRANSCRIBE, files={"file": ("a.wav", _wav(3))}, data=data or {})


def test_a_full_server_answers_429_and_a_request_past_its_deadline_504(random_pair):
    """One slot, no queue, a 2 s deadline, and the engine held busy: the running request gets
    504 at its deadline, another request 429; once the engine is free, the stopped
    transcription gives its slot back, its file is gone, and the server answers again."""
    engine = SharedEngine(random_pair)
    app = create_app(random_pair, ServerSettings(max_concurrent=1, max_queue=0, request_timeout=2.0), engine)
    results: dict = {}
    with serving(app) as running, client(running.url) as http:
        with engine.exclusive():  # the engine thread can run no model work until released
            first = threading.Thread(target=_post, args=(running.url, results, "first"))
            first.start()
            wait_for(lambda: http.get("/health").json()["running"] == 1, what="the first request to run")
            busy = http.post(TRANSCRIBE, files={"file": ("a.wav", _wav(1))})
            assert_openai_error(busy, 429, "queue_full")
            assert busy.headers["retry-after"] == "2"
            first.join()
            assert_openai_error(results["first"], 504, "timeout")
        wait_for(lambda: http.get("/health").json()["running"] == 0, what="the stopped run to end")
        wait_for(lambda: not any(app.state.temp_dir.iterdir()), what="the upload to be removed")
        assert http.post(TRANSCRIBE, files={"file": ("a.wav", _wav(1))}).status_code == 200
    engine.close()


def test_draining_finishes_the_running_request_and_503s_the_waiting_ones(random_pair):
    """SIGTERM's path in-process: the request running completes with its answer, the two
    waiting for a turn get 503 at once, and the app removes its temporary directory."""
    engine = SharedEngine(random_pair)
    app = create_app(random_pair, ServerSettings(max_concurrent=1, max_queue=4), engine)
    results: dict = {}
    with serving(app) as running, client(running.url) as http:
        threads = {n: threading.Thread(target=_post, args=(running.url, results, n)) for n in "abc"}
        with engine.exclusive():
            threads["a"].start()
            wait_for(lambda: http.get("/health").json()["running"] == 1, what="a to run")
            threads["b"].start()
            threads["c"].start()
            wait_for(lambda: http.get("/health").json()["queued"] == 2, what="b and c to wait")
            running.stop()
            threads["b"].join()
            threads["c"].join()
        threads["a"].join()
    for name in "bc":
        assert_openai_error(results[name], 503, "shutting_down")
    assert results["a"].status_code == 200 and "text" in results["a"].json()
    assert not app.state.temp_dir.exists()
    engine.close()


# ---- the packaged tiny.en: the openai client, the CLI's transcripts, SIGTERM ----------------
@pytest.fixture(scope="module")
def tiny(tiny_en_pair):
    app = create_app(with_self_draft(tiny_en_pair, 2), ServerSettings(model="tiny.en"))
    with serving(app) as running:
        yield running


def _openai(running) -> openai.OpenAI:
    http = openai.DefaultHttpxClient(trust_env=False)
    return openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0, http_client=http)


def test_the_openai_client_gets_every_response_format(tiny, librivox):
    clip = min(librivox, key=lambda c: sf.info(c.path).duration)
    api = _openai(tiny)
    answers = {}
    for fmt in RESPONSE_FORMATS:
        with open(clip.path, "rb") as f:
            answers[fmt] = api.audio.transcriptions.create(model="tiny.en", file=f, response_format=fmt)
    verbose = answers["verbose_json"]
    text = verbose.text
    assert text and answers["json"].text == text
    assert answers["text"] == text + "\n"
    assert answers["srt"].startswith("1\n00:00:00,000 --> ") and text in answers["srt"]
    assert answers["vtt"].startswith("WEBVTT\n\n00:00:00.000 --> ") and text in answers["vtt"]
    assert verbose.language == "english" and verbose.duration == pytest.approx(sf.info(clip.path).duration)
    assert "".join(s.text for s in verbose.segments).strip() == text and verbose.words is None
    segment = verbose.segments[0].model_dump()
    assert {"id", "seek", "start", "end", "text", "tokens", "temperature", "avg_logprob"} <= set(segment)
    extra = verbose.model_extra
    assert extra["task"] == "transcribe" and "outputs" not in extra
    speculation = extra["speculation"]
    assert (speculation["mode"], speculation["draft"]) == ("exact", "self:2")
    assert speculation["proposed"] == speculation["stats"]["proposed"] > 0
    assert 0 <= speculation["token_acceptance"] <= 1 and speculation["target_calls"] > 0


def test_word_granularity_times_every_word(tiny, librivox):
    api = _openai(tiny)
    with open(librivox[0].path, "rb") as f:
        verbose = api.audio.transcriptions.create(
            model="whisper-1", file=f, response_format="verbose_json", timestamp_granularities=["word"]
        )
    words = verbose.words
    assert words and " ".join(w.word for w in words).split() == verbose.text.split()
    assert all(w.word == w.word.strip() and w.start <= w.end for w in words)
    assert all(a.start <= b.start for a, b in zip(words, words[1:]))
    assert words[-1].end <= verbose.duration + 0.01


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the client marks translations
def test_translation_with_an_english_only_model_is_a_clean_400(tiny, librivox):
    with open(librivox[0].path, "rb") as f, pytest.raises(openai.BadRequestError) as e:
        _openai(tiny).audio.translations.create(model="whisper-1", file=f)
    assert e.value.status_code == 400
    assert "cannot translate" in e.value.body["message"]


SCORES = {"avg_logprob", "no_speech_prob"}


def _concatenated(clips, path: Path) -> Path:
    sf.write(
        path, np.concatenate([sf.read(c.path, dtype="int16")[0] for c in clips]), 16000, subtype="PCM_16"
    )
    return path


def test_concurrent_requests_decode_together_and_give_the_clis_outputs(tiny, librivox, tmp_path):
    """8 requests at once, of different clips: the engine decoded some batch with rows of
    several requests, and each answer's text and rendered outputs are what `specasr
    transcribe` gives for the same file (json: the same text, info and segments; its
    statistics differ, as a request's count the batches it shared, and its scores may differ in
    the last bits, as products over a batch's rows round differently)."""
    folder = tmp_path / "in"
    folder.mkdir()
    files = [Path(folder / c.path.name) for c in librivox]
    for c, dst in zip(librivox, files):
        dst.write_bytes(c.path.read_bytes())
    files += [_concatenated(librivox[i : i + 2], folder / f"pair{i}.wav") for i in range(3)]
    out = tmp_path / "out"
    args = ["transcribe", *map(str, files), "--model", "tiny.en", "--draft", "self:2"]
    result = CliRunner().invoke(main, [*args, "--format", "all", "-o", str(out)])
    assert result.exit_code == 0, result.output

    engine = tiny.app.state.engine
    before = len(engine.batches)
    answers: dict = {}

    def ask(path: Path) -> None:
        with client(tiny.url) as http, open(path, "rb") as f:
            data = {"response_format": "verbose_json", "outputs": "txt,srt,vtt,tsv,json"}
            answers[path.stem] = http.post(TRANSCRIBE, files={"file": (path.name, f)}, data=data)

    threads = [threading.Thread(target=ask, args=(p,)) for p in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(engine.batches[before:], default=0) > 1  # rows of different requests shared a batch
    for path in files:
        answer = answers[path.stem]
        assert answer.status_code == 200, answer.text
        body = answer.json()
        local = json.loads((out / f"{path.stem}.json").read_text(encoding="utf-8"))
        assert body["text"] == local["text"] and body["text"]
        for fmt in ("txt", "srt", "vtt", "tsv"):
            assert body["outputs"][fmt] == (out / f"{path.stem}.{fmt}").read_text(encoding="utf-8"), fmt
        remote = json.loads(body["outputs"]["json"])
        assert remote["info"] == local["info"]
        assert len(remote["segments"]) == len(local["segments"])
        for mine, theirs in zip(remote["segments"], local["segments"]):
            assert mine.keys() == theirs.keys()
            for key in mine.keys() - {"stats"} - SCORES:
                assert mine[key] == theirs[key], key
            for key in SCORES:  # a row of a batch: the same tokens, scores equal to rounding
                assert mine[key] == pytest.approx(theirs[key], abs=1e-5), key


@pytest.mark.slow  # loads tiny.en in a `specasr serve` process
def test_sigterm_under_load_answers_every_request_and_exits_0_leaving_no_files(tmp_path, librivox):
    """A real `specasr serve` with two slots, two requests running and two waiting, gets
    SIGTERM: the running ones finish with their transcripts, the others get a clean 503 (or run
    too, had a slot come free before the signal), the process exits 0 and leaves nothing in
    its TMPDIR."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    audio = _concatenated(librivox, tmp_path / "all.wav")
    port = free_port()
    command = [sys.executable, "-m", "specasr", "serve", "--model", "tiny.en", "--draft", "self:2"]
    command += ["--port", str(port), "--max-concurrent", "2"]
    env = {**os.environ, "TMPDIR": str(temp)}
    env.pop("SPECASR_API_KEY", None)
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    results: dict = {}
    try:
        with client(url) as http:

            def up() -> bool:
                assert proc.poll() is None, proc.stdout.read()
                try:
                    return http.get("/health").status_code == 200
                except Exception:  # noqa: BLE001 (not listening yet)
                    return False

            wait_for(up, 180, "the server to start")

            def ask(i: int) -> None:
                with client(url) as h, open(audio, "rb") as f:
                    results[i] = h.post(TRANSCRIBE, files={"file": ("all.wav", f)})

            threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            two_and_two = {"running": 2, "queued": 2}
            wait_for(
                lambda: http.get("/health").json().items() >= two_and_two.items(), what="2 running, 2 waiting"
            )
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    assert "Traceback" not in output, output
    done = [r for r in results.values() if r.status_code == 200]
    assert len(results) == 4 and len(done) >= 2, [r.text for r in results.values()]
    assert all(r.json()["text"].strip() for r in done)
    for r in results.values():
        if r.status_code != 200:
            assert_openai_error(r, 503, "shutting_down")
    assert list(temp.iterdir()) == []


@pytest.mark.slow
def test_the_readmes_openai_snippet_runs_against_the_server(tiny, librivox, monkeypatch, capsys):
    """The README's client snippet, as written, with only the address and the file replaced."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Server", 1)[1].split("\n## ", 1)[0]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "client.audio.transcriptions.create" in snippet and "http://127.0.0.1:8000/v1" in snippet
    clip = min(librivox, key=lambda c: sf.info(c.path).duration)
    snippet = snippet.replace("http://127.0.0.1:8000/v1", tiny.url + "/v1").replace(
        "talk.wav", str(clip.path)
    )
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    exec(compile(snippet, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    with open(clip.path, "rb") as f:
        expected = _openai(tiny).audio.transcriptions.create(model="tiny.en", file=f).text
    assert printed.startswith(expected + " english ") and expected


def test_a_new_server_removes_the_upload_dirs_of_killed_ones(random_pair, tmp_path, monkeypatch):
    """A server killed with SIGKILL leaves its upload directory; the next one to start removes
    it, and its own goes when it shuts down."""
    import tempfile

    from specasr.apps.server import TEMP_PREFIX

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{TEMP_PREFIX}{dead.pid}-abc"
    (stale / "upload").mkdir(parents=True)
    app = create_app(random_pair, ServerSettings())
    with serving(app):
        assert not stale.exists()
        own = app.state.temp_dir
        assert own.parent == tmp_path and own.name.startswith(f"{TEMP_PREFIX}{os.getpid()}-")
    assert not own.exists()


def test_request_threads_leave_the_cores_to_the_engine(random_pair, monkeypatch):
    """A request's worker thread prepares the work (audio, features) on itself alone: the
    engine thread's OpenMP team is then the process's only one (`process.one_openmp_team`),
    and the engine keeps the process's thread count."""
    import torch

    counts: list[int] = []
    real = serve_work.transcribe

    def spy(*args, **kwargs):
        counts.append(torch.get_num_threads())  # in the request's thread
        return real(*args, **kwargs)

    monkeypatch.setattr(serve_work, "transcribe", spy)
    engine = SharedEngine(random_pair)
    app = create_app(random_pair, ServerSettings(), engine)
    with serving(app) as running, client(running.url) as http:
        assert http.post(TRANSCRIBE, files={"file": ("a.wav", _wav(1))}).status_code == 200
    assert counts == [1]
    assert engine.run(torch.get_num_threads) == torch.get_num_threads()
    engine.close()
