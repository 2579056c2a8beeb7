"""Issue 23 ("Hardening"), the app's parts: uploads go with the app on SIGTERM / SIGHUP / Ctrl-C
and stale upload dirs are removed; seeds out of range are a clear message; loud float audio
warns; the transcript shows where each token came from; "Compare" reports medians."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from specasr.apps import service
from specasr.apps.private_dirs import remove_stale
from specasr.apps.service import (
    SEED_LIMIT,
    TOKEN_KINDS,
    AppOptions,
    Comparison,
    Controls,
    InputError,
    Run,
    accepted_per_step,
    compare,
    load_input,
    token_spans,
)

from specasr.audio import AudioWarning
from specasr.cli.app import TEMP_PREFIX
from specasr.options import TranscribeOptions
from specasr.results import Segment, TranscriptionInfo
from specasr.stats import DecodeStats

# ---------------------------------------------------------------- item 2: temp dirs and signals

# `specasr app` in a fresh interpreter, with no models and a stub page for the Blocks (the
# command, its temp dir and signal handling, `launch` and Gradio's server are the real ones).
_APP = """
import importlib, signal, sys, types
# Ctrl-C as from a terminal: a run launched in the background (`pytest &`) hands its children
# SIGINT ignored, and Python then never turns it into KeyboardInterrupt
signal.signal(signal.SIGINT, signal.default_int_handler)
import specasr.cli.app as cli_app
from specasr.cli import main

def build_app(pair, options):
    import gradio as gr  # only now: `specasr app` has set GRADIO_TEMP_DIR, as with the real app

    with gr.Blocks() as demo:
        gr.Markdown("stub")
    return demo

def launch(*args, **kwargs):
    del sys.modules["specasr.apps.gradio_app"]
    return importlib.import_module("specasr.apps.gradio_app").launch(*args, **kwargs)

stub = types.ModuleType("specasr.apps.gradio_app")
stub.build_app, stub.launch = build_app, launch
sys.modules["specasr.apps.gradio_app"] = stub
cli_app.load_models = lambda *args, **kwargs: None
main(["app", "--port", sys.argv[1]], prog_name="specasr")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _owned_dirs(root: Path, pid: int) -> list[Path]:
    return sorted(root.glob(f"{TEMP_PREFIX}{pid}-*"))


def _start_app(tmp_path: Path) -> tuple[subprocess.Popen, str, Path]:
    root = tmp_path / "tmp"
    root.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "GRADIO_TEMP_DIR"}
    env.update(TMPDIR=str(root), GRADIO_ANALYTICS_ENABLED="False", NO_PROXY="127.0.0.1,localhost")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _APP, str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(url, timeout=2, trust_env=False).status_code == 200:
                return proc, url, root
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    pytest.fail("the app did not serve within 180 s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_app_removes_its_uploads_when_stopped_by_a_signal(tmp_path, sig):
    """`kill -TERM` (systemd, docker stop) used to leave the temp dir and every upload in /tmp;
    only Ctrl-C cleaned up."""
    proc, url, root = _start_app(tmp_path)
    try:
        dirs = _owned_dirs(root, proc.pid)
        assert len(dirs) == 1, list(root.iterdir())
        upload = tmp_path / "speech.wav"
        sf.write(upload, np.zeros(1600, np.float32), 16000)
        with upload.open("rb") as f:
            response = httpx.post(url + "gradio_api/upload", files={"files": f}, timeout=30, trust_env=False)
        assert response.status_code == 200, response.text
        assert list(dirs[0].rglob("speech.wav")), "the upload did not land in the app's temp dir"
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not dirs[0].exists(), output
    assert list(root.iterdir()) == [], list(root.iterdir())


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temp_dirs_of_dead_apps_are_removed(tmp_path):
    """A dir whose owner pid is dead (SIGKILL, a crash) goes; a live owner's, and others, stay."""
    dead = tmp_path / f"{TEMP_PREFIX}{_dead_pid()}-abc"
    (dead / "upload").mkdir(parents=True)
    (dead / "upload" / "speech.wav").write_bytes(b"RIFF")
    live = tmp_path / f"{TEMP_PREFIX}{os.getppid()}-def"
    mine = tmp_path / f"{TEMP_PREFIX}{os.getpid()}-ghi"
    other = tmp_path / "specasr-app-notapid"
    legacy_file = tmp_path / f"{TEMP_PREFIX}{_dead_pid()}-file"
    for d in (live, mine, other):
        d.mkdir()
    legacy_file.write_text("not a dir")
    assert remove_stale(TEMP_PREFIX, str(tmp_path)) == [str(dead)]
    assert not dead.exists() and live.is_dir() and mine.is_dir() and other.is_dir() and legacy_file.exists()


# ---------------------------------------------------------------- item 7: seeds and loud audio


@pytest.mark.parametrize("seed", [2**70, float(2**70), 2**63, -1, 1.5, float("nan"), float("inf"), None])
def test_seed_out_of_range_is_a_clear_message(seed):
    with pytest.raises(InputError, match=r"The seed must be a whole number from 0 to 9223372036854775807"):
        Controls(seed=seed).options()


@pytest.mark.parametrize(
    ("field", "value"), [("gamma", 0), ("gamma", 17), ("temperature", 1.5), ("temperature", -0.1)]
)
def test_gamma_and_temperature_out_of_range_are_refused(field, value):
    """The same bounds as the CLI's and the server's, for requests that bypass the sliders."""
    with pytest.raises(InputError, match="γ must be|temperature must be"):
        Controls(**{field: value}).options()


def test_seed_in_range_reaches_the_decoder():
    assert Controls(seed=SEED_LIMIT - 1).options().decode.seed == SEED_LIMIT - 1
    assert Controls(seed=7.0).options().decode.seed == 7  # Gradio's Number sends floats


def test_load_input_warns_on_loud_float_audio_and_refuses_long_audio_without_decoding(tmp_path):
    loud = tmp_path / "loud.wav"
    tone = np.sin(np.linspace(0, 2000, 16000, dtype=np.float32)) * 300.0
    sf.write(loud, tone, 16000, subtype="FLOAT")
    with pytest.warns(AudioWarning, match="scaled to a peak of 1.0"):
        x = load_input(str(loud), AppOptions())
    assert np.abs(x).max() == pytest.approx(1.0, abs=1e-3)
    long = tmp_path / "long.wav"
    sf.write(long, np.zeros(16000 * 12, np.int16), 16000)
    with pytest.raises(InputError, match=r"The audio is 12\.0 s long; this app takes up to 10 s"):
        load_input(str(long), AppOptions(max_seconds=10))


# ---------------------------------------------------------------- item 8: what the app shows


class _Tokenizer:
    """Word-per-token stand-in: ids 0..9 are words, 100 is <|endoftext|>, 101.. specials."""

    eot, sot = 100, 101
    words = ["a", " cat", " sat", " on", " the", " mat", ".", " é", "x", "y"]

    def decode(self, tokens):
        return "".join(self.words[t] for t in tokens)


class _Pair:
    tokenizer = _Tokenizer()


def _segment(tokens, kinds, stats, text) -> Segment:
    return Segment(0, 0.0, 1.0, text, tokens, -0.1, 1.0, 0.0, 0.0, 0, stats, kinds)


def _run(segments, stats, wall_s=1.0, mode="exact") -> Run:
    info = TranscriptionInfo("en", False, 2.0, TranscribeOptions(), "t", "d", stats)
    return Run(mode, segments, info, wall_s)


def test_token_spans_mark_each_token_accepted_corrected_or_bonus():
    stats = DecodeStats()
    segments = [
        _segment([102, 0, 1, 2, 103], ["target", "draft", "draft", "corrected", "bonus"], stats, "a cat sat"),
        _segment([3, 4, 5, 6], ["draft", "bonus", "corrected", "target"], stats, " on the mat."),
    ]
    spans = token_spans(_Pair(), _run(segments, stats))
    assert spans == [
        ("a", "accepted draft"),
        (" cat", "accepted draft"),
        (" sat", "target-corrected"),
        (" on", "accepted draft"),
        (" the", "bonus"),
        (" mat", "target-corrected"),
        (".", "target only"),
    ]
    assert {label for _, label in spans} <= set(TOKEN_KINDS.values())
    unknown = _segment([0, 1], [], stats, "a cat")  # chunked decoding: kinds not recorded
    assert token_spans(_Pair(), _run([unknown], stats)) == [("a", None), (" cat", None)]


def test_accepted_per_step_counts_every_verify_step():
    stats = DecodeStats()
    stats.record_pass(4, [4, 0], [5, 1], False)
    stats.record_pass(4, [2], [3], False)
    stats.record_pass(3, [0], [1], True)
    assert accepted_per_step(_run([], stats)) == [(0, 2), (1, 0), (2, 1), (3, 0), (4, 1)]
    assert sum(c for _, c in accepted_per_step(_run([], stats))) == stats.row_steps
    assert accepted_per_step(_run([], DecodeStats())) == []  # autoregressive: no plot


def test_compare_reports_the_median_of_three_runs(monkeypatch):
    walls = iter([3.0, 1.0, 9.0, 2.0, 4.0, 8.0])  # reference, candidate, reference, ...
    modes = []

    def fake_run(pair, samples, controls):
        modes.append(controls.mode)
        stats = DecodeStats(decoder_s=1.0)
        return _run([_segment([0], ["target"], stats, "a")], stats, next(walls), controls.mode)

    monkeypatch.setattr(service, "run", fake_run)
    comparison = compare(None, np.zeros(16000, np.float32), Controls(mode="exact"))
    assert modes == ["autoregressive", "exact"] * 3
    assert comparison.reference_walls == [3.0, 9.0, 4.0] and comparison.candidate_walls == [1.0, 2.0, 8.0]
    assert comparison.speedup == pytest.approx(4.0 / 2.0)  # median over median
    summary = comparison.summary()
    assert "**Speedup 2.00×**" in summary and "median of 3 runs each" in summary, summary
    assert "4.00 s autoregressive, 2.00 s exact" in summary
    one = Comparison(comparison.reference, comparison.candidate)  # one run: said plainly
    assert one.runs == 1 and "one run each" in one.summary()


@pytest.mark.slow
def test_real_run_shows_the_speculation(base_shipped, librivox):
    """The packaged base target and its default draft: every text token is labelled, the
    labels spell the transcript, and the plot covers every verify step."""
    pair = base_shipped
    assert pair.draft is not None
    clip = next(c for c in librivox if c.id.endswith("0880"))
    result = service.run(pair, load_input(str(clip.path), AppOptions()), Controls(mode="exact"))
    spans = token_spans(pair, result)
    assert "".join(text for text, _ in spans).strip() == result.text
    kinds = Counter(label for _, label in spans)
    assert kinds["accepted draft"] > 0 and set(kinds) <= set(TOKEN_KINDS.values()), kinds
    steps = accepted_per_step(result)
    assert sum(c for _, c in steps) == result.info.stats.row_steps > 0
    assert sum(n * c for n, c in steps) == result.info.stats.accepted
