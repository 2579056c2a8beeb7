"""The Gradio app over real HTTP (gradio_client) and in a real browser (Debian's headless
Chromium driven by playwright-core): one app, launched once on 127.0.0.1, serves every test."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from dataclasses import astuple
from pathlib import Path

import httpx
import pytest
from conftest import with_self_draft
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from specasr.apps.gradio_app import build_app, launch
from specasr.apps.service import AppOptions, Controls
from test_app_service import _srt_cues

from specasr.eval.metric import wer
from specasr.options import MODES

pytestmark = [
    pytest.mark.slow,
    # gradio's queue calls pandas APIs that pandas 3 deprecates: not ours to fix
    pytest.mark.filterwarnings("ignore:.*no_silent_downcasting:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated:DeprecationWarning"),
]

ROOT = Path(__file__).resolve().parents[1]
BROWSER = ROOT / "tests" / "browser"
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
# Every fixture clip fits the upload limit; clip 0870 (7.1 s) is over the duration limit.
LIMITS = AppOptions(max_seconds=6.5, max_upload_mb=0.5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def upload_dir(tmp_path_factory):
    """Gradio's temporary directory for this module's app (where uploads must land)."""
    path = tmp_path_factory.mktemp("gradio-temp")
    before = os.environ.get("GRADIO_TEMP_DIR")
    os.environ["GRADIO_TEMP_DIR"] = str(path)
    yield path
    if before is None:
        del os.environ["GRADIO_TEMP_DIR"]
    else:
        os.environ["GRADIO_TEMP_DIR"] = before


@pytest.fixture(scope="module")
def server(base_pair, upload_dir):
    demo = build_app(with_self_draft(base_pair, 2), LIMITS)
    _, url, share_url = launch(demo, LIMITS, port=_free_port(), block=False)
    assert demo.server_name == "127.0.0.1" and url.startswith("http://127.0.0.1:") and share_url is None
    yield url
    demo.close()


@pytest.fixture(scope="module")
def client(server):
    return Client(server, verbose=False, download_files=False)  # the transcript files stay served


def _clip(librivox, suffix):
    return next(c for c in librivox if c.id.endswith(suffix))


def _transcribe(client, path, api="/transcribe", **controls):
    return client.predict(handle_file(str(path)), *astuple(Controls(**controls)), api_name=api)


def _value(output):
    """A component's value from the client: returned as is, or inside an update dict."""
    return output["value"] if isinstance(output, dict) and "value" in output else output


def _plot_rows(output) -> list:
    value = _value(output)
    return value["data"] if value else []


def _stats(markdown: str) -> dict[str, str]:
    rows = [line.strip("|").split("|") for line in markdown.splitlines()[2:]]
    return {k.strip(): v.strip() for k, v in rows}


def test_every_mode_transcribes_a_fixture_over_http(client, librivox, upload_dir):
    clip = _clip(librivox, "0890")
    texts = {}
    for mode in MODES:
        transcript, stats, speculation, accepted, files = _transcribe(client, clip.path, mode=mode)
        assert sorted(Path(f["path"]).suffix for f in files) == [".json", ".srt", ".tsv", ".txt", ".vtt"]
        match = re.fullmatch(r"\[0\.00 → (\d+\.\d\d)\] (.+)", transcript)
        assert match, transcript
        assert 4.0 < float(match[1]) <= 5.4  # the clip is 5.3 s long
        texts[mode] = match[2]
        assert wer([clip.text], [match[2]]) <= 0.1, (mode, transcript)
        table = _stats(stats)
        assert table["mode"] == mode
        assert float(table["real-time factor"].split()[0]) > 0
        assert table["verifier time"].endswith(" ms") and int(table["target calls"]) > 0
        spans = [(run["token"], run["class_or_confidence"]) for run in _value(speculation)]
        assert "".join(text for text, _ in spans).strip() == match[2]  # one span per token
        labels = {label for _, label in spans}
        if mode == "autoregressive":
            assert (
                labels == {"target only"} and accepted["value"] is None or not accepted.get("visible", True)
            )
            assert table["draft calls"] == "0"
            assert table["α̂ per token (accepted / reached draft tokens)"] == "n/a"
            assert table["tokens per target call"] == "1.00"
        else:
            assert int(table["draft calls"]) > 0 and float(table["tokens per target call"]) >= 1.0
            # the default policy on a CPU is backoff: the 2-layer self-draft accepts about one
            # token in 20, so after its first judged tokens the run steps target-only
            assert labels <= {"accepted draft", "target-corrected", "bonus", "target only"}, labels
            assert "target only" in labels and "target-corrected" in labels, labels
            rows = _plot_rows(accepted)
            assert 0 < sum(row[1] for row in rows) <= int(table["target calls"])  # one row: each pass
            per_token = float(table["α̂ per token (accepted / reached draft tokens)"])
            assert 0.0 <= float(table["accepted / proposed draft tokens"]) <= per_token <= 1.0
    assert texts["baseline"] == texts["exact"] == texts["autoregressive"]  # exact at temperature 0
    assert any(p.name == clip.path.name for p in upload_dir.rglob("*.wav"))  # uploads stay in Gradio's dir


def test_toggles_reach_the_decoder(client, librivox):
    clip = _clip(librivox, "0880")
    transcript, stats, *_ = _transcribe(
        client, clip.path, mode="exact", timestamps=False, gamma_policy="fixed", gamma=3, language="auto"
    )
    assert not transcript.startswith("[") and wer([clip.text], [transcript]) <= 0.1, transcript
    assert _stats(stats)["mode"] == "exact"
    fixed = _transcribe(client, clip.path, mode="exact", gamma_policy="fixed", gamma=3)[2]
    labels = {run["class_or_confidence"] for run in _value(fixed)}
    assert "target only" not in labels and "target-corrected" in labels, labels  # never backs off
    sampled, *_ = _transcribe(client, clip.path, mode="exact", temperature=1.0, seed=3, timestamps=False)
    assert sampled.strip()
    with pytest.raises(AppError, match=r"The seed must be a whole number from 0 to 9223372036854775807"):
        _transcribe(client, clip.path, mode="exact", temperature=1.0, seed=2**70)


def test_prompts_and_word_timestamps_give_downloads_that_go_with_the_app(
    base_pair, librivox, upload_dir, tmp_path
):
    """Hotwords reach the decoder ("Mister" over base's "Mr."), word timestamps reach the
    downloads, and the app's download folder goes when its server stops."""
    clip = _clip(librivox, "0870")  # 7.1 s: over this module's LIMITS, so an app of its own
    before = set(upload_dir.glob("specasr-downloads-*"))
    demo = build_app(base_pair)
    _, url, _ = launch(demo, port=_free_port(), block=False)
    try:
        (root,) = set(upload_dir.glob("specasr-downloads-*")) - before
        client = Client(url, verbose=False, download_files=str(tmp_path))
        outputs = _transcribe(
            client,
            clip.path,
            mode="autoregressive",
            hotwords="Mister",
            word_timestamps=True,
            timestamps=False,
        )
        served = sorted(root.rglob("*.*"))
        assert [p.name for p in served] == [
            f"{clip.path.stem}.{f}" for f in ("json", "srt", "tsv", "txt", "vtt")
        ]
    finally:
        demo.close()
    transcript, files = outputs[0], {Path(f).suffix[1:]: Path(f).read_text() for f in outputs[4]}
    assert "Mister John Dashwood" in transcript and wer([clip.text], [transcript]) <= 0.1, transcript
    doc = json.loads(files["json"])
    assert doc["text"] == transcript and doc["info"]["model"] == "base"
    words = [w for s in doc["segments"] for w in s["words"]]
    assert "".join(w["word"] for w in words).strip() == transcript
    assert all(0 <= w["start"] <= w["end"] <= 7.2 for w in words) and words[-1]["end"] > 5
    cues = _srt_cues(files["srt"])
    assert " ".join(text for _, _, text in cues).split() == transcript.split()
    assert files["vtt"].startswith("WEBVTT\n\n") and files["txt"].split() == transcript.split()
    assert not root.exists() and not any(p.exists() for p in served)  # gone with the server


def test_compare_shows_both_transcripts_and_the_speedup(client, librivox):
    clip = _clip(librivox, "0880")
    reference, candidate, summary = _transcribe(client, clip.path, "/compare", mode="exact")
    assert candidate["label"] == "exact"
    texts = ["".join(run["token"] for run in side["value"]).strip() for side in (reference, candidate)]
    assert texts[0] == texts[1] and wer([clip.text], [texts[0]]) <= 0.1, texts
    assert all(run["class_or_confidence"] is None for side in (reference, candidate) for run in side["value"])
    speedup = re.search(r"Speedup (\d+\.\d+)×", summary)
    assert speedup and float(speedup[1]) > 0 and "identical tokens" in summary, summary
    assert "median of 3 runs each" in summary, summary


def test_bad_input_is_a_message_and_the_app_keeps_serving(client, server, librivox, tmp_path):
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x00\x00garbage" * 10)
    with pytest.raises(AppError, match="Cannot read this audio"):
        _transcribe(client, corrupt)
    with pytest.raises(AppError, match=r"The audio is 7\.1 s long; this app takes up to 6\.5 s"):
        _transcribe(client, _clip(librivox, "0870").path)
    with pytest.raises(AppError, match="sigmoid_scale needs α < β"):
        _transcribe(client, _clip(librivox, "0880").path, mode="sigmoid", sigmoid_alpha=1.0, sigmoid_beta=0.0)
    with pytest.raises(AppError, match="Pick a speculative mode"):
        _transcribe(client, _clip(librivox, "0880").path, "/compare", mode="autoregressive")
    big = tmp_path / "big.wav"
    big.write_bytes(os.urandom(600_000))
    with pytest.raises(ValueError, match="exceeds the maximum file size"):  # refused before it is sent
        _transcribe(client, big)
    with big.open("rb") as f:  # and by the server itself
        response = httpx.post(server + "gradio_api/upload", files={"files": ("big.wav", f)}, timeout=60)
    assert response.status_code == 413, response.text
    clip = _clip(librivox, "0930")
    transcript, *_ = _transcribe(client, clip.path, mode="exact", timestamps=False)
    assert wer([clip.text], [transcript]) <= 0.1, transcript


def test_browser_upload_mode_switch_transcribe_and_compare(server, librivox, tmp_path):
    assert Path(CHROMIUM).is_file(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    assert (BROWSER / "node_modules" / "playwright-core").is_dir(), "run: npm ci --prefix tests/browser"
    clip = _clip(librivox, "0880")
    shot = tmp_path / "app.png"
    proc = subprocess.run(
        ["node", "app.mjs", server, str(clip.path), "baseline", str(shot), "--compare"],
        cwd=BROWSER,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    page = json.loads(proc.stdout)
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "app.png")
    assert shot.read_bytes().startswith(b"\x89PNG")
    assert page["external"] == [] and page["errors"] == [], page  # loopback only, no script errors
    text = page["transcript"].split("] ", 1)[1]
    assert wer([clip.text], [text]) <= 0.1, page["transcript"]
    assert "baseline" in page["stats"] and "real-time factor" in page["stats"]
    assert text.split()[0] in page["speculation"] and page["plot"], page  # token kinds and the plot
    assert re.search(r"Speedup \d+\.\d+×", page["speedup"]), page["speedup"]
    assert text in page["reference"] and text in page["candidate"], page
