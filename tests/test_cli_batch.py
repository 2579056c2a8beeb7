"""`specasr transcribe` over batches of real files, through click's runner."""

from __future__ import annotations

import json
import re
import shutil

import jsonschema
import pytest
from click.testing import CliRunner

from specasr.cli import main
from specasr.eval.metric import wer
from specasr.writers import FORMATS, JSON_SCHEMA

TINY = ["--model", "tiny.en", "--mode", "autoregressive"]


def _invoke(*args: str):
    return CliRunner().invoke(main, ["transcribe", *args], catch_exceptions=False)


def _listing(folder) -> list[str]:
    """The outputs in `folder`, without the hidden records of their sources."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


@pytest.fixture
def clips(librivox, tmp_path):
    """Three LibriVox clips copied into a folder, plus a corrupt wav beside them."""
    folder = tmp_path / "in"
    folder.mkdir()
    for clip in librivox[:3]:
        shutil.copy(clip.path, folder / clip.path.name)
    (folder / "broken.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt garbage")
    return folder


@pytest.mark.slow
def test_corrupt_file_is_reported_and_the_rest_are_written(clips, librivox, tmp_path):
    out = tmp_path / "out"
    result = _invoke(str(clips), *TINY, "--format", "srt", "--format", "txt", "-o", str(out))
    assert result.exit_code == 1
    assert "broken.wav" in result.stderr and "1 of 4 file(s) failed" in result.stderr
    assert "files: 3 done, 0 skipped, 1 failed" in result.stderr and "real-time factor" in result.stderr
    written = _listing(out)
    assert written == sorted(f"{c.path.stem}.{ext}" for c in librivox[:3] for ext in ("srt", "txt"))
    for clip in librivox[:3]:
        assert wer([clip.text], [(out / f"{clip.path.stem}.txt").read_text()]) <= 0.3
    assert result.stdout == ""


@pytest.mark.slow
def test_skip_existing_resumes_an_interrupted_batch(clips, librivox, tmp_path):
    out = tmp_path / "out"
    (clips / "broken.wav").unlink()
    first = clips / librivox[0].path.name
    assert _invoke(str(first), *TINY, "-o", str(out)).exit_code == 0  # the batch stopped after one file
    done = out / f"{first.stem}.txt"
    stamp = done.stat().st_mtime_ns
    result = _invoke(str(clips / "*.wav"), *TINY, "-o", str(out), "--skip-existing")
    assert result.exit_code == 0, result.output
    assert "files: 2 done, 1 skipped, 0 failed" in result.stderr
    assert done.stat().st_mtime_ns == stamp
    assert _listing(out) == sorted(f"{c.path.stem}.txt" for c in librivox[:3])


@pytest.mark.slow
def test_format_all_writes_every_format(librivox, tmp_path):
    out = tmp_path / "out"
    clip = librivox[1]
    args = [str(clip.path), "--model", "tiny.en", "--draft", "self:2", "--mode", "exact"]
    result = _invoke(*args, "--format", "all", "-o", str(out), "--stats")
    assert result.exit_code == 0, result.output
    assert _listing(out) == sorted(f"{clip.path.stem}.{f}" for f in FORMATS)
    doc = json.loads((out / f"{clip.path.stem}.json").read_text())
    jsonschema.validate(doc, JSON_SCHEMA)
    assert doc["stats"]["proposed"] > 0 and doc["info"]["draft"] == "self:2"
    assert "α̂=" in result.stderr
    assert re.search(r"α̂ per token 0\.\d{3} \(accepted/proposed 0\.\d{3}\)", result.stderr)


@pytest.mark.slow
def test_one_file_without_output_dir_prints_the_format(librivox):
    result = _invoke(str(librivox[1].path), *TINY, "--format", "vtt")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("WEBVTT\n\n00:00:00.000 --> ")
    assert "young man" in result.stdout


@pytest.mark.slow
def test_unmatched_inputs_fail_but_the_batch_goes_on(librivox, tmp_path):
    result = _invoke(str(tmp_path / "nothing-*.wav"), str(librivox[1].path), *TINY)
    assert result.exit_code == 1
    assert "nothing-*.wav" in result.stderr and "1 of 2 file(s) failed" in result.stderr
    assert "young man" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["a.wav", "--format", "srt", "--format", "json"],  # several formats to stdout
        ["a.wav", "b.wav", "--format", "srt"],  # several files, not plain text, to stdout
        ["a.wav", "--skip-existing"],
        ["a.wav", "--strategy", "magic"],
        ["a.wav", "--batch-size", "0"],
        ["a.wav", "--format", "doc"],
    ],
)
def test_usage_errors_exit_2(args):
    assert _invoke(*args).exit_code == 2


@pytest.mark.slow
def test_the_readme_batch_command(librivox, tmp_path, monkeypatch):
    """`specasr transcribe tests/data/*.wav --mode exact --format srt -o out/` on the default model."""
    data = librivox[0].path.parent
    monkeypatch.chdir(tmp_path)
    result = _invoke(str(data / "*.wav"), "--mode", "exact", "--format", "srt", "-o", "out/")
    assert result.exit_code == 0, result.output
    assert _listing(tmp_path / "out") == sorted(f"{c.path.stem}.srt" for c in librivox)
    for clip in librivox:
        text = (tmp_path / "out" / f"{clip.path.stem}.srt").read_text()
        assert text.startswith("1\n00:00:0") and wer([clip.text], [" ".join(text.splitlines()[2::4])]) <= 0.2
