"""Whisper's search options (beam size, best-of, patience, length penalty) on every front end:
`specasr transcribe` under both spellings, `specasr serve`'s form fields, the `--server`
client and the app's controls. Nothing here decodes: each test reads the DecodeOptions a front
end builds (the search itself is tested with the engine, in test_beam.py)."""

from __future__ import annotations

import importlib
from dataclasses import astuple

import pytest
from click.testing import CliRunner
from specasr.apps.openai_api import FIELDS, ApiError, Served, parse_request
from specasr.apps.service import Controls, InputError

from specasr.cli import main
from specasr.cli import remote as remote_module
from specasr.cli.remote import OPTION_FIELDS, form_fields
from specasr.options import MAX_BEAMS, DecodeOptions

SEARCH = ("beam_size", "best_of", "patience", "length_penalty")  # DecodeOptions' names
cli_transcribe = importlib.import_module("specasr.cli.transcribe")  # the package's name is the command
SERVED = Served(("base", "whisper-1"), True, True, frozenset({"en", "de"}))
DEFAULTS = (1, 1, 1.0, None)  # DecodeOptions': greedy, one sample, openai-whisper's patience, / length


def _search(decode: DecodeOptions) -> tuple:
    return decode.beam_size, decode.best_of, decode.patience, decode.length_penalty


@pytest.fixture()
def built(monkeypatch):
    """The TranscribeOptions `specasr transcribe` hands its batch, one per run; a model load
    or a server connection is recorded in their place, as the fields the client would send."""
    seen = {"options": [], "fields": []}

    class Batch:
        failed = 0

        def __init__(self, pair, options, *args, **kwargs):
            seen["options"].append(options)

        def run(self, files):
            pass

        def summary(self):
            return ""

    class Client:
        def __init__(self, url, fields, *args, **kwargs):
            seen["fields"].append(fields)

        def health(self):
            pass

    monkeypatch.setattr(cli_transcribe, "load_models", lambda *a, **k: "pair")
    monkeypatch.setattr(cli_transcribe, "Batch", Batch)
    monkeypatch.setattr(remote_module, "Client", Client)
    return seen


def _transcribe(librivox, *args: str):
    return CliRunner().invoke(main, ["transcribe", str(librivox[0].path), *args])


# ---- CLI ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["--beam-size", "4", "--best-of", "3", "--patience", "2", "--length-penalty", "0.5"],
        ["--beam_size", "4", "--best_of", "3", "--patience", "2", "--length_penalty", "0.5"],
    ],
)
def test_each_search_option_reaches_the_decode_options_under_both_spellings(args, built, librivox):
    result = _transcribe(librivox, *args)
    assert result.exit_code == 0, result.output
    (options,) = built["options"]
    assert _search(options.decode) == (4, 3, 2.0, 0.5)
    assert options.temperatures[0] == options.decode.temperature == 0.0  # the rest as before


def test_left_out_or_none_the_search_is_decode_options_default(built, librivox):
    assert _search(DecodeOptions()) == DEFAULTS
    for args in ([], ["--length-penalty", "none"], ["--length_penalty", "None", "--beam-size", "1"]):
        result = _transcribe(librivox, *args)
        assert result.exit_code == 0, result.output
        assert _search(built["options"][-1].decode) == DEFAULTS
    assert _search(parse_request([], "transcribe", SERVED).options.decode) == DEFAULTS  # the server's
    assert _search(Controls().options().decode) == DEFAULTS  # the app's


@pytest.mark.parametrize(
    "args, message",
    [
        (["--beam-size", "0"], "0 is not in the range 1<=x<=16"),
        (["--beam_size", "17"], "17 is not in the range 1<=x<=16"),
        (["--beam-size", "2.5"], "'2.5' is not a valid integer"),
        (["--best-of", "0"], "'--best-of'"),
        (["--best_of", "17"], "17 is not in the range 1<=x<=16"),
        (["--patience", "0"], "0.0 is not in the range x>0"),
        (["--patience", "-1"], "'--patience'"),
        (["--patience", "nan"], "patience must be a finite number > 0"),
        (["--patience", "inf"], "patience must be a finite number > 0"),
        (["--length-penalty", "1.5"], "'1.5' is not within [0, 1] (or 'none')"),
        (["--length_penalty", "-0.1"], "is not within [0, 1]"),
        (["--length-penalty", "long"], "'long' is not a number or 'none'"),
    ],
)
def test_bad_search_values_exit_2_before_loading(args, message, librivox, monkeypatch):
    monkeypatch.setattr(cli_transcribe, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    result = _transcribe(librivox, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_help_lists_both_spellings_and_says_how_beams_speculate():
    result = CliRunner().invoke(main, ["transcribe", "--help"])
    assert result.exit_code == 0
    for name in SEARCH:
        assert "--" + name.replace("_", "-") in result.output and f"--{name}" in result.output, name
    text = "".join(result.output.split())  # as wrapped, "target-only" may break after its hyphen
    for phrase in (
        "On a CPU the beams decode with the target alone, in every mode",
        "on a GPU the draft proposes each beam's continuation and the target checks them in one pass",
    ):
        assert "".join(phrase.split()) in text, phrase


# ---- server and --server --------------------------------------------------------------------------
def test_the_server_maps_the_search_fields():
    items = [("beam_size", "4"), ("best_of", "3"), ("patience", "1.5"), ("length_penalty", "0.25")]
    assert _search(parse_request(items, "transcribe", SERVED).options.decode) == (4, 3, 1.5, 0.25)
    off = parse_request([("length_penalty", "none"), ("beam_size", "16")], "transcribe", SERVED)
    assert _search(off.options.decode) == (MAX_BEAMS, 1, 1.0, None)


@pytest.mark.parametrize(
    "name, text",
    [
        ("beam_size", "0"),
        ("beam_size", "17"),
        ("beam_size", "2.5"),
        ("best_of", "0"),
        ("best_of", "many"),
        ("patience", "0"),
        ("patience", "nan"),
        ("patience", "inf"),
        ("length_penalty", "1.5"),
        ("length_penalty", "-0.5"),
        ("length_penalty", "x"),
    ],
)
def test_a_bad_search_field_is_a_400_naming_it(name, text):
    with pytest.raises(ApiError) as e:
        parse_request([(name, text)], "transcribe", SERVED)
    assert (e.value.status, e.value.param, e.value.code) == (400, name, "invalid_value"), e.value.message
    assert f"'{name}' must be" in e.value.message


def test_the_client_sends_the_search_options_given(built, librivox):
    assert set(SEARCH) <= set(OPTION_FIELDS) and set(SEARCH) <= set(FIELDS)
    fields = form_fields({"beam_size": 4, "best_of": 3, "patience": 2.0, "length_penalty": 0.5})
    assert fields == {"beam_size": "4", "best_of": "3", "patience": "2.0", "length_penalty": "0.5"}
    served = parse_request(list(fields.items()), "transcribe", SERVED).options
    assert _search(served.decode) == (4, 3, 2.0, 0.5)
    assert form_fields({"length_penalty": None}) == {}  # `none` is the server's default too
    # from the command line: only what was given goes
    result = _transcribe(librivox, "--server", "http://127.0.0.1:9", "--beam_size", "5", "--patience", "3")
    assert result.exit_code == 0, result.output
    assert built["fields"] == [{"beam_size": "5", "patience": "3.0"}]


# ---- the app --------------------------------------------------------------------------------------
def test_the_apps_beam_size_reaches_the_decode_options():
    assert astuple(Controls(beam_size=4.0))[-1] == 4.0  # the last widget, a slider (floats)
    assert Controls(beam_size=4.0).options().decode.beam_size == 4
    for bad in (0, MAX_BEAMS + 1, 2.5, None):
        with pytest.raises(InputError, match=f"The beam size must be a whole number from 1 to {MAX_BEAMS}"):
            Controls(beam_size=bad).options()
