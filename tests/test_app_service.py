"""The app's request logic (specasr.apps.service) and the `specasr app` command, without a server."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner
from specasr.apps.service import AppOptions, Controls, InputError, load_input, word_diff

from specasr.cli import main
from specasr.options import FALLBACK_TEMPERATURES, TranscribeOptions


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
    ).options()
    d = opts.decode
    assert (d.mode, d.gamma_policy, d.gamma, d.gamma_max) == ("sigmoid", "fixed", 12, 16)
    assert d.draft_stop == 0.35
    assert d.sigmoid_scale == (-4.0, 6.0) and d.language == "de" and d.task == "translate"
    assert d.timestamps is False and d.seed == 7
    assert opts.temperatures[0] == 0.5 and opts.temperatures[-1] <= 1.0
    with pytest.raises(ValueError, match="α < β"):
        Controls(sigmoid_alpha=1, sigmoid_beta=1).options()


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
    assert calls["load"] == (("base", "default", "exact", None, None, "float32"), {"half_weights": True})
    assert calls["build"] == (("pair", AppOptions(max_seconds=30)), {})
    assert calls["launch"] == (
        ("demo", AppOptions(max_seconds=30)),
        {"host": "127.0.0.1", "port": 7860, "share": False},
    )
    assert os.path.basename(os.environ["GRADIO_TEMP_DIR"]).startswith("specasr-app-")  # a private temp dir
    calls.clear()
    result = CliRunner().invoke(main, ["app", "--host", "0.0.0.0", "--port", "9000", "--share"])
    assert result.exit_code == 0, result.output
    assert calls["launch"][1] == {"host": "0.0.0.0", "port": 9000, "share": True}


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
