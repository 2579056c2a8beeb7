"""The app's request logic (specasr.apps.service) and the `specasr app` command, without a server."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner
from specasr.apps import service
from specasr.apps.service import (
    PROMPT_TOKENS,
    AppOptions,
    Controls,
    Downloads,
    InputError,
    Run,
    load_input,
    word_diff,
)

from specasr.cli import main
from specasr.models.loading import offline_files
from specasr.options import FALLBACK_TEMPERATURES, TranscribeOptions, VadOptions
from specasr.results import Segment, TranscriptionInfo, Word
from specasr.stats import DecodeStats
from specasr.tokenizer import Tokenizer


def test_controls_map_onto_the_library_options():
    default = Controls().options()
    # the app starts from the library's defaults, but detects the language as the CLI does, and
    # times the phases for its statistics table
    assert Controls().language == "auto" and default.decode.language is None
    assert default == TranscribeOptions().with_decode(timing=True, language=None)
    assert default.temperatures == FALLBACK_TEMPERATURES
    opts = Controls(
        mode="sigmoid",
        gamma_policy="fixed",
        gamma=12.0,  # sliders send floats
        draft_stop=0.35,
        temperature=0.5,
        sigmoid_alpha=-4,
        sigmoid_beta=6,
        language="de",
        task="translate",
        timestamps=False,
        seed=7.0,
        strategy="chunked",
        vad=True,
        word_timestamps=True,
        initial_prompt="  Mister Dashwood spoke.\n",
        hotwords="Dashwood Norland",
    ).options()
    d = opts.decode
    assert (d.mode, d.gamma_policy, d.gamma, d.gamma_max) == ("sigmoid", "fixed", 12, 16)
    assert d.draft_stop == 0.35
    assert d.sigmoid_scale == (-4.0, 6.0) and d.language == "de" and d.task == "translate"
    assert d.timestamps is False and d.seed == 7
    assert opts.temperatures[0] == 0.5 and opts.temperatures[-1] <= 1.0
    assert opts.strategy == "chunked" and opts.vad == VadOptions() and opts.word_timestamps is True
    assert opts.initial_prompt == "Mister Dashwood spoke." and opts.hotwords == "Dashwood Norland"
    assert (default.strategy, default.vad, default.word_timestamps) == ("sequential", None, False)
    blank = Controls(initial_prompt="  ", hotwords="").options()  # an empty box prompts nothing
    assert blank.initial_prompt is None and blank.hotwords is None
    with pytest.raises(ValueError, match="α < β"):
        Controls(sigmoid_alpha=1, sigmoid_beta=1).options()


def test_bad_strategy_and_prompts_too_long_are_refused():
    with pytest.raises(InputError, match=r"The strategy must be one of sequential, chunked; got 'greedy'"):
        Controls(strategy="greedy").options()
    with pytest.raises(InputError, match=r"The hotwords is 2001 characters; this app takes up to 2000"):
        Controls(hotwords="x" * 2001).options()
    with pytest.raises(InputError, match="The initial prompt must be text"):
        Controls(initial_prompt=5).options()
    # in the base model's own tokens: 223 fit, the 224th would push the prompt's start out
    tok = Tokenizer.from_file(offline_files("base").tokenizer)
    words = " ".join(["hello"] * PROMPT_TOKENS)
    assert len(tok.encode(" " + words)) == PROMPT_TOKENS == 223
    assert Controls(initial_prompt=words).checked(tok).initial_prompt == words
    with pytest.raises(InputError, match=r"are 224 tokens together; Whisper keeps at most 223"):
        Controls(initial_prompt=words, hotwords="hello").checked(tok)
    with pytest.raises(InputError, match=r"are 224 tokens together"):
        Controls(initial_prompt=words + " hello").checked(tok)


def _word_timed_run() -> Run:
    stats = DecodeStats()
    words = [
        [Word(" Hello", 0.5, 0.9, 0.9), Word(" there.", 0.9, 1.4, 0.8)],
        [Word(" Mister", 2.0, 2.4, 0.7)],
    ]
    segments = [
        Segment(
            i, w[0].start, w[-1].end, "".join(x.word for x in w), [], -0.2, 1.1, 0.01, 0.0, 0, stats, words=w
        )
        for i, w in enumerate(words)
    ]
    info = TranscriptionInfo("en", False, 3.0, TranscribeOptions(word_timestamps=True), "base", None, stats)
    return Run("exact", segments, info, 1.0)


def _srt_cues(text: str) -> list[tuple[str, str, str]]:
    """(start, end, text) of each srt cue, checking the numbering and timing lines."""
    cues = []
    for n, block in enumerate(text.strip().split("\n\n"), start=1):
        number, timing, *lines = block.split("\n")
        match = re.fullmatch(r"(\d\d:\d\d:\d\d,\d{3}) --> (\d\d:\d\d:\d\d,\d{3})", timing)
        assert number == str(n) and match and lines, block
        cues.append((match[1], match[2], " ".join(lines)))
    return cues


def test_downloads_are_every_format_and_go_when_closed(tmp_path):
    downloads = Downloads(str(tmp_path), keep_s=3600)
    result = _word_timed_run()
    paths = [Path(p) for p in downloads.write(result, "/uploads/abc/my talk (1).wav")]
    assert sorted(p.name for p in paths) == [f"my_talk_1_.{f}" for f in ("json", "srt", "tsv", "txt", "vtt")]
    files = {p.suffix[1:]: p.read_text() for p in paths}
    assert all(p.parent.parent == Path(downloads.root) for p in paths)
    doc = json.loads(files["json"])
    assert doc["text"] == result.text == "Hello there. Mister"
    assert [w["word"] for s in doc["segments"] for w in s["words"]] == [" Hello", " there.", " Mister"]
    assert _srt_cues(files["srt"]) == [
        ("00:00:00,500", "00:00:01,400", "Hello there."),
        ("00:00:02,000", "00:00:02,400", "Mister"),
    ]
    assert files["vtt"].startswith("WEBVTT\n\n00:00:00.500 --> 00:00:01.400\nHello there.\n")
    assert files["txt"].split() == result.text.split()
    again = downloads.write(result)  # a second request: its own folder, the first one kept
    assert Path(again[0]).name.startswith("transcript.") and Path(again[0]).parent != paths[0].parent
    assert all(p.is_file() for p in paths)
    downloads.keep_s = 0  # now stale: the next request removes both earlier folders
    latest = downloads.write(result)
    assert not paths[0].parent.exists() and not Path(again[0]).parent.exists()
    assert [d.name for d in Path(downloads.root).iterdir()] == [Path(latest[0]).parent.name]
    downloads.close()
    assert not Path(downloads.root).exists() and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_initial_prompt_reaches_the_decoder(base_pair, librivox):
    """The prompt's spelling carries over: "Mister" turns base's "Mr. John Dashwood" around."""
    clip = next(c for c in librivox if c.id.endswith("0870"))
    samples = load_input(str(clip.path), AppOptions())
    plain = service.run(base_pair, samples, Controls(mode="autoregressive"))
    assert "Mr. John Dashwood" in plain.text, plain.text
    prompted = service.run(base_pair, samples, Controls(mode="autoregressive", initial_prompt="Mister"))
    assert "Mister John Dashwood" in prompted.text, prompted.text
    assert prompted.info.options.initial_prompt == "Mister"


def test_word_diff_labels_what_the_other_side_lacks():
    left, right = word_diff("the cat sat on the mat", "the cat sits on a mat today")
    assert "".join(t for t, _ in left).split() == "the cat sat on the mat".split()
    assert "".join(t for t, _ in right).split() == "the cat sits on a mat today".split()
    assert [t.strip() for t, label in left if label] == ["sat", "the"]
    assert [t.strip() for t, label in right if label] == ["sits", "a", "today"]
    same, _ = word_diff("a b c", "a b c")
    assert same == [("a b c ", None)]


def test_load_input_enforces_the_limits_with_clear_messages(librivox, tmp_path):
    clip = next(c for c in librivox if c.id.endswith("0870"))  # 7.1 s, 227 kB
    assert len(load_input(str(clip.path), AppOptions())) == round(7.1 * 16000)
    with pytest.raises(InputError, match="Record or upload"):
        load_input(None, AppOptions())
    with pytest.raises(InputError, match=r"The audio is 7\.1 s long; this app takes up to 5 s"):
        load_input(str(clip.path), AppOptions(max_seconds=5))
    with pytest.raises(InputError, match=r"The file is 0\.2 MB; this app takes files up to 0\.1 MB"):
        load_input(str(clip.path), AppOptions(max_upload_mb=0.1))
    corrupt = tmp_path / "corrupt.flac"
    corrupt.write_bytes(b"fLaC not really")
    with pytest.raises(InputError, match="Cannot read this audio"):
        load_input(str(corrupt), AppOptions())
    stereo = tmp_path / "stereo-8k.wav"
    sf.write(stereo, np.zeros((8000, 2), np.float32), 8000)
    assert load_input(str(stereo), AppOptions()).shape == (16000,)  # mono 16 kHz, like the library
    with pytest.raises(ValueError, match="max_seconds must be > 0"):
        AppOptions(max_seconds=0)


def test_app_command_binds_to_loopback_unless_told(monkeypatch):
    monkeypatch.delenv("GRADIO_TEMP_DIR", raising=False)
    import specasr.apps.gradio_app as gradio_app

    import specasr.cli.app as cli_app

    calls = {}

    def record(name, returns=None):
        def fake(*args, **kwargs):
            calls[name] = (args, kwargs)
            return returns

        return fake

    monkeypatch.setattr(cli_app, "load_models", record("load", "pair"))
    monkeypatch.setattr(gradio_app, "build_app", record("build", "demo"))
    monkeypatch.setattr(gradio_app, "launch", record("launch"))
    result = CliRunner().invoke(main, ["app", "--max-seconds", "30"])
    assert result.exit_code == 0, result.output
    load = ("base", "default", "exact", None, None, "float32")
    assert calls["load"] == (load, {"half_weights": True, "threads": 0})
    assert calls["build"] == (("pair", AppOptions(max_seconds=30)), {})
    assert calls["launch"] == (
        ("demo", AppOptions(max_seconds=30)),
        {"host": "127.0.0.1", "port": 7860, "share": False},
    )
    assert os.path.basename(os.environ["GRADIO_TEMP_DIR"]).startswith("specasr-app-")  # a private temp dir
    calls.clear()
    args = ["app", "--host", "0.0.0.0", "--port", "9000", "--share", "--threads", "3"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert calls["launch"][1] == {"host": "0.0.0.0", "port": 9000, "share": True}
    assert calls["load"] == (load, {"half_weights": True, "threads": 3})  # set by load_models


def test_app_command_help_and_usage_errors():
    result = CliRunner().invoke(main, ["app", "--help"])
    assert result.exit_code == 0
    assert "[default: 127.0.0.1]" in " ".join(result.output.split()) and "--share" in result.output
    result = CliRunner().invoke(main, ["app", "--max-upload-mb", "0"])
    assert result.exit_code == 2 and "max_upload_mb must be > 0" in result.output


def test_readme_shows_the_app():
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    assert "specasr app" in readme and "](docs/app.png)" in readme
    assert (root / "docs" / "app.png").read_bytes().startswith(b"\x89PNG")
