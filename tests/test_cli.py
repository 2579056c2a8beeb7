"""The `specasr` command line, through click's runner on real files."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from specasr.cli import main
from specasr.eval.metric import wer


@pytest.mark.slow  # loads tiny.en
def test_transcribe_prints_one_transcript_per_file(librivox):
    paths = [str(c.path) for c in librivox[:2]]
    result = CliRunner().invoke(
        main, ["transcribe", *paths, "--model", "tiny.en", "--draft", "self:2", "--mode", "exact", "--stats"]
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 2
    for line, clip in zip(lines, librivox[:2]):
        path, text = line.split(": ", 1)
        assert path == str(clip.path)
        assert wer([clip.text], [text]) <= 0.3
    assert "α̂=" in result.stderr and "target calls" in result.stderr


@pytest.mark.slow  # loads tiny.en
def test_without_timestamps_decodes_text_tokens_only(librivox, tiny_en_pair):
    """`--without-timestamps` reaches the decoder: the json segments of a clip hold no
    timestamp token, where the default decode of the same clip holds them."""
    import json

    ts_begin = tiny_en_pair.tokenizer.timestamp_begin
    tokens = {}
    for flag in ([], ["--without-timestamps"]):
        args = ["transcribe", str(librivox[0].path), "--model", "tiny.en", "--draft", "self:2"]
        result = CliRunner().invoke(main, [*args, "--format", "json", *flag])
        assert result.exit_code == 0, result.output
        segments = json.loads(result.stdout)["segments"]
        tokens[bool(flag)] = [t for s in segments for t in s["tokens"]]
    assert any(t >= ts_begin for t in tokens[False])
    assert tokens[True] and all(t < ts_begin for t in tokens[True])


@pytest.mark.slow  # loads base; runs espeak-ng (CI installs it)
def test_the_language_is_detected_unless_given(tmp_path):
    """By default each input's language is detected, as a user of a multilingual model
    expects: German speech is transcribed in German. `--language en` forces English, which
    turns the same speech into something else."""
    import json
    import subprocess

    wav = tmp_path / "de.wav"
    text = "Guten Morgen, wie geht es Ihnen heute? Das Wetter ist sehr schön."
    wav.write_bytes(
        subprocess.run(
            ["espeak-ng", "-v", "de", "-s", "150", "--stdout", text], capture_output=True, check=True
        ).stdout
    )
    seen = {}
    for given in ([], ["--language", "en"]):
        result = CliRunner().invoke(main, ["transcribe", str(wav), "--format", "json", *given])
        assert result.exit_code == 0, result.output
        seen[bool(given)] = json.loads(result.stdout)
        told = [line for line in result.stderr.splitlines() if "detected language" in line]
        pattern = r"de\.wav: detected language de \(probability (0\.\d\d|1\.00)\)"
        assert len(told) == (0 if given else 1) and all(re.fullmatch(pattern, t) for t in told), told
    auto, forced = seen[False], seen[True]
    assert (auto["info"]["language"], auto["info"]["language_detected"]) == ("de", True)
    assert 0.5 < auto["info"]["language_probability"] <= 1
    assert forced["info"]["language_probability"] is None
    assert (forced["info"]["language"], forced["info"]["language_detected"]) == ("en", False)
    assert wer(["guten morgen wie geht es ihnen heute"], [" ".join(auto["text"].split()[:7])]) <= 0.3
    assert wer([text], [auto["text"]]) < wer([text], [forced["text"]])


@pytest.mark.slow  # loads base in int8 with the packaged draft
def test_an_int8_target_transcribes_in_the_default_exact_mode_as_it_does_autoregressively(librivox):
    """`--compute-type int8` with the default mode (exact) runs speculation and prints the
    int8 target's own greedy transcript, that of `--mode autoregressive --compute-type int8`."""
    paths = [str(c.path) for c in librivox[:2]]
    out, err = {}, {}
    for mode in ("exact", "autoregressive"):
        args = ["transcribe", *paths, "--model", "base", "--compute-type", "int8", "--mode", mode, "--stats"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        out[mode], err[mode] = result.stdout, result.stderr
    assert out["exact"] == out["autoregressive"] and out["exact"].count(": ") == 2
    assert "young man" in out["exact"].lower()
    assert "α̂=" in err["exact"]  # the draft ran


@pytest.mark.slow  # loads tiny.en
def test_bad_file_is_reported_and_the_batch_goes_on(librivox, tmp_path):
    bad = tmp_path / "corrupt.wav"
    bad.write_bytes(b"RIFF\x00\x00garbage")
    good = str(librivox[1].path)
    result = CliRunner().invoke(
        main, ["transcribe", str(bad), good, "--model", "tiny.en", "--mode", "autoregressive"]
    )
    assert result.exit_code == 1
    assert "corrupt.wav" in result.stderr
    assert "young man" in result.stdout.lower()  # the good file after the bad one was transcribed
    assert "1 of 2 file(s) failed" in result.stderr


def test_usage_errors_exit_2():
    result = CliRunner().invoke(main, ["transcribe", "x.wav", "--mode", "nonsense"])
    assert result.exit_code == 2
    result = CliRunner().invoke(main, ["transcribe", "x.wav", "--gamma", "0"])
    assert result.exit_code == 2 and "gamma" in result.output


def test_models_lists_presets():
    result = CliRunner().invoke(main, ["models"])
    assert result.exit_code == 0
    rows = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[1:]}
    assert rows["base"] == "yes" and rows["tiny.en"] == "yes"
    assert {"small.en", "medium.en", "large-v2", "large-v3"} <= set(rows)


def test_unloadable_model_is_a_clear_error_in_every_command(tmp_path, librivox):
    """A directory that holds no model fails to load (exit 1, one message); a path that is not
    there is a usage error before anything loads (exit 2)."""
    empty = tmp_path / "no-model-here"
    empty.mkdir()
    for args in (["transcribe", str(librivox[0].path)], ["bench", str(librivox[0].path)]):
        result = CliRunner().invoke(main, [*args, "--model", str(empty), "--draft", "self:2"])
        assert result.exit_code == 1, (args, result.output)
        assert "cannot load model" in result.stderr and "no-model-here" in result.stderr
    missing = str(tmp_path / "no-such-model")
    result = CliRunner().invoke(main, ["transcribe", str(librivox[0].path), "--model", missing])
    assert result.exit_code == 2 and "no such directory" in result.stderr, result.output


_PROBE = """
import atexit, sys
import click
from specasr import cli

@cli.main.command("probe")
@click.argument("how")
def probe(how):
    atexit.register(lambda: print("atexit ran", file=sys.stderr))
    sys.stdout.write("written, not flushed")
    if how == "message":
        sys.exit("a message")
    if how == "status":
        sys.exit(3)
    if how == "crash":
        raise RuntimeError("boom")

sys.argv = ["specasr", "probe", *sys.argv[1:]]
cli.run()
"""


@pytest.mark.parametrize(
    "args, status, err",
    [
        (["ok"], 0, "atexit ran"),
        (["message"], 1, "a message"),
        (["status"], 3, "atexit ran"),
        ([], 2, "Missing argument"),  # click's usage error
        (["crash"], 1, "RuntimeError: boom"),  # not a SystemExit: Python's own exit, traceback
    ],
)
def test_the_command_exits_quickly_with_mains_status_output_and_exit_handlers(args, status, err):
    """`specasr` (`cli.run`) leaves through `process.quick_exit` (os._exit) after main: the
    status is main's, what was written to stdout is flushed, and atexit handlers have run."""
    import subprocess
    import sys

    child = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=120)
    assert child.returncode == status, child.stderr
    assert err in child.stderr
    if args and args[0] != "crash":
        assert child.stdout == "written, not flushed" and "atexit ran" in child.stderr


_START_UP = """
import gc, json, sys
from specasr.backends import process
if sys.argv[1] == "claimed":
    process.claim_process()
if sys.argv[2] == "off":
    gc.disable()
frozen = gc.get_freeze_count()
with process.start_up():
    inside = gc.isenabled()
    made = [[i] for i in range(1000)]  # containers the collector tracks
first = gc.get_freeze_count()
with process.start_up():  # a second load in the same process (eval: one per mode) never freezes
    again = [[i] for i in range(1000)]
print(json.dumps({"inside": inside, "after": gc.isenabled(), "frozen": first - frozen,
                  "second": gc.get_freeze_count() - first}))
"""


@pytest.mark.parametrize(
    ("claimed", "collector", "expect"),
    [
        ("claimed", "on", {"inside": False, "after": True, "frozen": True}),  # a specasr process
        ("unclaimed", "on", {"inside": False, "after": True, "frozen": False}),  # tests, embedding
        ("claimed", "off", {"inside": False, "after": False, "frozen": False}),  # the caller's choice
    ],
)
def test_start_up_pauses_the_collector_and_freezes_only_in_its_own_process(claimed, collector, expect):
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _START_UP, claimed, collector], capture_output=True, text=True, check=True
    ).stdout
    seen = json.loads(out)
    assert seen.pop("second") == 0
    assert {**seen, "frozen": seen["frozen"] >= 1000} == expect


def test_a_command_imports_its_own_module_only():
    """`specasr transcribe` starts without the app's and the server's modules; help lists every
    command all the same."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from specasr.cli import COMMANDS, main\n"
        "assert not any(m.split(':')[0] in sys.modules for m in COMMANDS.values())\n"
        "assert CliRunner().invoke(main, ['transcribe', '--help']).exit_code == 0\n"
        "loaded = sorted(n for n, m in COMMANDS.items() if m.split(':')[0] in sys.modules)\n"
        "assert loaded == ['transcribe'], loaded\n"
        "assert 'specasr.apps.service' not in sys.modules and 'specasr.apps.openai_api' not in sys.modules\n"
        "listed = CliRunner().invoke(main, ['--help']).output\n"
        "assert all(f'  {name} ' in listed for name in [*COMMANDS, 'models']), listed\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr
