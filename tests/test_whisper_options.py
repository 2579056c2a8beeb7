"""Whisper's decoding options (issue 54, item 2): their effect on real recordings, through the
library, the CLI (openai-whisper's names) and the server's form fields."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner
from conftest import with_self_draft
from specasr.apps.openai_api import Served, parse_request

from specasr.cli import main
from specasr.cli.remote import form_fields
from specasr.options import (
    WHISPER_DEFAULTS,
    DecodeOptions,
    TranscribeOptions,
    front_end_options,
    parse_clip_timestamps,
    parse_suppress_tokens,
)
from specasr.tokenizer import LANGUAGES
from specasr.transcription import transcribe, transcribe_clip

SR = 16_000
MULTI = Served(("base", "whisper-1"), True, True, frozenset(LANGUAGES))


def _text(pair, audio, options, **kw) -> str:
    segments, _ = transcribe(audio, pair, options, **kw)
    return "".join(s.text for s in segments)


def _clip(pair, audio, options: DecodeOptions):
    return transcribe_clip(audio, pair, options, source_rate=SR)


def _samples(clip) -> np.ndarray:
    samples, rate = sf.read(str(clip.path), dtype="float32")
    assert rate == SR
    return samples


# ---- library --------------------------------------------------------------------------------------
def test_a_hotword_or_an_initial_prompt_fixes_a_names_spelling(base_pair, librivox):
    """On a real recording: base writes the reference's "mister john dashwood" as "Mr. John
    Dashwood"; the hotword "Mister" or a prompt spelling it makes it "Mister John Dashwood",
    and a hotword with another spelling of the name is followed too."""
    clip = librivox[0]
    assert "mister john dashwood" in clip.text
    plain = TranscribeOptions().with_decode(mode="autoregressive")
    assert "Mr. John Dashwood" in _text(base_pair, clip.path, plain)
    assert "Mister John Dashwood" in _text(base_pair, clip.path, replace(plain, hotwords="Mister"))
    prompted = replace(plain, initial_prompt="Mister John Dashwood.")
    assert "Mister John Dashwood" in _text(base_pair, clip.path, prompted)
    assert "Dashwod" in _text(base_pair, clip.path, replace(plain, hotwords="Dashwod"))


def test_hotwords_prompt_every_window_before_the_previous_text(base_pair, librivox, spy):
    tok = base_pair.tokenizer
    audio = np.concatenate([_samples(c) for c in librivox] * 2)  # about 49 s: two windows
    opts = replace(TranscribeOptions().with_decode(mode="autoregressive", language="en"), hotwords="Dashwood")
    segments, _ = transcribe(audio, base_pair, opts, source_rate=SR)
    segments = list(segments)
    hot = tok.encode(" Dashwood")
    assert len(spy) == 2 and spy[0][1] == hot
    first_window = [t for s in segments if s.window == 0 for t in s.tokens]
    assert spy[1][1] == hot + first_window


def test_a_prefix_forces_the_first_words_of_the_first_window_only(base_pair, librivox, spy):
    clip = librivox[0]
    audio = np.concatenate([_samples(c) for c in librivox] * 2)
    opts = TranscribeOptions().with_decode(mode="autoregressive", language="en", prefix="Yes indeed")
    segments, _ = transcribe(audio, base_pair, opts, source_rate=SR)
    segments = list(segments)
    assert segments[0].text.startswith(" Yes indeed")
    assert [o.prefix for o, _ in spy] == ["Yes indeed", None]  # the second window decodes freely
    assert segments[0].token_kinds[:3] == ["prefix"] * 3  # <|0.00|> Yes indeed
    # the decode goes on after the forced words: the rest of the clip is heard
    assert (
        "Dashwood" in segments[0].text and clip.text.split()[-1] in " ".join(s.text for s in segments).lower()
    )


def test_a_prefix_gives_the_same_tokens_in_every_mode(base_pair, librivox):
    pair = with_self_draft(base_pair, 2)
    audio = _samples(librivox[0])
    for timestamps in (False, True):
        results = [
            _clip(pair, audio, DecodeOptions(mode=m, prefix="Yes indeed", timestamps=timestamps))
            for m in ("autoregressive", "exact", "baseline")
        ]
        assert results[0].text.startswith(" Yes indeed,")
        assert all(r.tokens == results[0].tokens for r in results)
        forced = 2 + timestamps
        assert results[0].token_kinds[:forced] == ["prefix"] * forced
        assert results[0].token_kinds[forced] == "target"


def test_a_prefix_that_leaves_no_room_is_refused(base_pair, librivox):
    with pytest.raises(ValueError, match="no room"):
        _clip(base_pair, _samples(librivox[1]), DecodeOptions(mode="autoregressive", prefix="word " * 500))


def test_max_initial_timestamp_bounds_the_first_timestamp(base_pair, librivox):
    """Speech after 2 s of silence: Whisper's rule puts the first timestamp at most 1 s in;
    without the bound the model starts the segment where the speech starts."""
    audio = np.concatenate([np.zeros(2 * SR, np.float32), _samples(librivox[1])])
    tb = base_pair.tokenizer.timestamp_begin
    first = {}
    for bound in (1.0, None):
        opts = DecodeOptions(mode="autoregressive", timestamps=True, max_initial_timestamp=bound)
        first[bound] = (_clip(base_pair, audio, opts).tokens[0] - tb) * 0.02
    assert first[1.0] <= 1.0 < 1.5 <= first[None]


def test_suppressed_tokens_are_never_emitted(base_pair, librivox):
    tok = base_pair.tokenizer
    audio = _samples(librivox[1])
    period = tok.encode(".")
    assert len(period) == 1
    plain = _clip(base_pair, audio, DecodeOptions(mode="autoregressive"))
    assert period[0] in plain.tokens
    held = _clip(base_pair, audio, DecodeOptions(mode="autoregressive", suppress_ids=tuple(period)))
    assert period[0] not in held.tokens and "young man" in held.text
    with pytest.raises(ValueError, match="beyond the vocabulary"):
        _clip(base_pair, audio, DecodeOptions(mode="autoregressive", suppress_ids=(60_000,)))


def test_the_lists_parse_as_openai_whisper_writes_them():
    assert parse_suppress_tokens("-1") == (True, ())
    assert parse_suppress_tokens("-1,13, 11") == (True, (13, 11))
    assert parse_suppress_tokens("") == (False, ())
    assert parse_suppress_tokens("13") == (False, (13,))
    for bad in ("x", "-2", "1.5"):
        with pytest.raises(ValueError, match="suppress_tokens"):
            parse_suppress_tokens(bad)
    assert parse_clip_timestamps("0") == () and parse_clip_timestamps("") == ()
    assert parse_clip_timestamps("1.5, 4,10") == (1.5, 4.0, 10.0)
    for bad in ("a,b", "1,inf"):
        with pytest.raises(ValueError, match="clip_timestamps"):
            parse_clip_timestamps(bad)


def test_front_end_options_map_each_whisper_option():
    o = front_end_options(
        initial_prompt="Names.",
        prefix="Hello",
        hotwords="Dashwood",
        condition_on_previous_text=False,
        compression_ratio_threshold=None,
        logprob_threshold=-0.5,
        no_speech_threshold=0.3,
        max_initial_timestamp=2.0,
        suppress_tokens="13",
        language_detection_threshold=0.8,
        language_detection_segments=3,
        multilingual=True,
    )
    assert (o.initial_prompt, o.decode.prefix, o.hotwords) == ("Names.", "Hello", "Dashwood")
    assert not o.condition_on_previous_text and o.compression_ratio_threshold is None
    assert (o.logprob_threshold, o.no_speech_threshold, o.decode.max_initial_timestamp) == (-0.5, 0.3, 2.0)
    assert not o.decode.suppress_tokens and o.decode.suppress_ids == (13,)
    assert (o.language_detection_threshold, o.language_detection_segments) == (0.8, 3) and o.multilingual
    # None means "the default" where a value cannot be off
    d = front_end_options(suppress_tokens=None, condition_on_previous_text=None)
    assert d.decode.suppress_tokens and d.condition_on_previous_text
    with pytest.raises(TypeError, match="num_beams"):
        front_end_options(num_beams=5)
    with pytest.raises(ValueError, match="sequential"):
        front_end_options(prefix="Hello", strategy="chunked")


# ---- CLI ------------------------------------------------------------------------------------------
def test_transcribe_help_lists_every_whisper_option():
    result = CliRunner().invoke(main, ["transcribe", "--help"])
    assert result.exit_code == 0
    for name in [*WHISPER_DEFAULTS, "threads", "verbose"]:
        dashed = "--" + name.replace("_", "-")
        assert dashed in result.output, dashed
        if "_" in name and name != "vad_max_speech":
            assert f"--{name}" in result.output, name  # openai-whisper's spelling too


@pytest.mark.parametrize(
    "args, message",
    [
        (["--suppress-tokens", "x"], "suppress_tokens"),
        (["--suppress_tokens", "99999"], "beyond every Whisper vocabulary"),
        (["--clip-timestamps", "a,b"], "clip_timestamps"),
        (["--logprob-threshold", "abc"], "not a number"),
        (["--no-speech-threshold", "2"], "not within"),
        (["--prefix", "Hi", "--strategy", "chunked"], "sequential"),
        (["--hallucination-silence-threshold", "2"], "word"),
        (["--language-detection-segments", "0"], "language-detection-segments"),
        (["--condition_on_previous_text", "maybe"], "condition"),
        (["--threads", "-1"], "threads"),
    ],
)
def test_bad_whisper_options_exit_2_before_loading(args, message, librivox, monkeypatch):
    import specasr.cli.transcribe as cli_transcribe

    monkeypatch.setattr(cli_transcribe, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    result = CliRunner().invoke(main, ["transcribe", str(librivox[1].path), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.slow  # loads base
def test_cli_whisper_options_reach_the_decoder(librivox):
    """--prefix forces the first words; --logprob_threshold 0 (no decode reaches it) sends every
    window through the fallback temperatures; `none` turns a threshold off."""
    path = str(librivox[0].path)
    args = ["transcribe", path, "--model", "base", "--language", "en", "--format", "json"]
    out = CliRunner().invoke(main, [*args, "--prefix", "Yes indeed"])
    assert out.exit_code == 0, out.output
    segments = json.loads(out.stdout)["segments"]
    assert segments[0]["text"].startswith(" Yes indeed")
    out = CliRunner().invoke(
        main, [*args, "--logprob_threshold", "0", "--compression-ratio-threshold", "none"]
    )
    assert out.exit_code == 0, out.output
    assert all(s["temperature"] > 0 for s in json.loads(out.stdout)["segments"])


@pytest.mark.slow  # loads base
def test_verbose_prints_segments_as_they_come_and_threads_are_set(librivox):
    import torch

    before = torch.get_num_threads()
    try:
        out = CliRunner().invoke(
            main, ["transcribe", str(librivox[1].path), "--model", "base", "--verbose", "--threads", "1"]
        )
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert out.exit_code == 0, out.output
    lines = [line for line in out.stderr.splitlines() if line.startswith("[00:")]
    assert len(lines) == 1 and " --> " in lines[0] and "young man" in lines[0]
    assert "young man" in out.stdout and "[00:" not in out.stdout


# ---- server and --server --------------------------------------------------------------------------
def test_the_server_takes_the_whisper_options_as_form_fields():
    items = [
        ("prompt", "Names."),
        ("prefix", "Hello"),
        ("hotwords", "Dashwood"),
        ("condition_on_previous_text", "false"),
        ("logprob_threshold", "none"),
        ("no_speech_threshold", "0.3"),
        ("suppress_tokens", "-1,13"),
        ("clip_timestamps", "0,5"),
        ("language_detection_segments", "2"),
    ]
    o = parse_request(items, "transcribe", MULTI).options
    assert (o.initial_prompt, o.decode.prefix, o.hotwords) == ("Names.", "Hello", "Dashwood")
    assert not o.condition_on_previous_text and o.logprob_threshold is None
    assert o.no_speech_threshold == 0.3 and o.decode.suppress_ids == (13,) and o.decode.suppress_tokens
    assert o.clip_timestamps == (0.0, 5.0) and o.language_detection_segments == 2
    from specasr.apps.openai_api import ApiError

    for bad in (("no_speech_threshold", "7"), ("suppress_tokens", "x"), ("prefix_x", "a")):
        with pytest.raises(ApiError):
            parse_request([bad], "transcribe", MULTI)


def test_the_client_sends_the_options_given_by_the_servers_names():
    fields = form_fields(
        {"initial_prompt": "Names.", "logprob_threshold": None, "hotwords": "Dashwood", "prefix": None}
    )
    assert fields == {"prompt": "Names.", "logprob_threshold": "none", "hotwords": "Dashwood"}
    assert parse_request(list(fields.items()), "transcribe", MULTI).options.logprob_threshold is None


def test_an_unsure_first_window_lets_the_next_windows_vote_on_the_language(base_pair):
    """30 s of faint noise and then German speech: the noise alone is 'nn' below 0.5, so with
    two windows allowed the German window decides; a bar no window reaches makes it a vote, which
    the likelier language on average wins."""
    import subprocess

    from specasr.audio import load_audio

    text = "Guten Morgen, wie geht es Ihnen heute? Das Wetter ist sehr schön. Ich fahre morgen nach Berlin."
    wav = subprocess.run(
        ["espeak-ng", "-v", "de", "-s", "150", "--stdout", text], capture_output=True, check=True
    )
    noise = (np.random.default_rng(0).standard_normal(30 * SR) * 0.003).astype(np.float32)
    audio = np.concatenate([noise, load_audio(wav.stdout)])
    plain = TranscribeOptions().with_decode(mode="autoregressive")

    def detected(**kw):
        _, info = transcribe(audio, base_pair, replace(plain, **kw), source_rate=SR)
        return info

    alone = detected()
    assert alone.language != "de" and alone.language_probability < 0.5
    two = detected(language_detection_segments=2)
    assert two.language == "de" and two.language_probability >= 0.5
    vote = detected(language_detection_segments=2, language_detection_threshold=0.99)
    assert vote.language == "de" and vote.all_language_probs[0][0] == "de"
    assert alone.language_probability < vote.language_probability < two.language_probability


def test_multilingual_decodes_each_window_in_its_own_language(base_pair, librivox):
    """English (a LibriVox clip, then silence to 30 s) and then German: with multilingual each
    window detects its language, the segments say en and de and the German is German; without,
    every window is decoded as the first window's English."""
    import subprocess

    from specasr.audio import load_audio

    text = "Guten Morgen, wie geht es Ihnen heute? Das Wetter ist sehr schön. Ich fahre morgen nach Berlin."
    wav = subprocess.run(
        ["espeak-ng", "-v", "de", "-s", "150", "--stdout", text], capture_output=True, check=True
    )
    english = load_audio(librivox[1].path)
    audio = np.concatenate([english, np.zeros(30 * SR - len(english), np.float32), load_audio(wav.stdout)])
    plain = TranscribeOptions().with_decode(mode="autoregressive")
    segments, info = transcribe(audio, base_pair, replace(plain, multilingual=True), source_rate=SR)
    segments = list(segments)
    assert info.language == "en" and [s.language for s in segments][0] == "en"
    german = [s for s in segments if s.language == "de"]
    assert (
        german and "Morgen" in " ".join(s.text for s in german) and segments[-1].to_dict()["language"] == "de"
    )
    fixed, _ = transcribe(audio, base_pair, plain, source_rate=SR)
    fixed = list(fixed)
    assert all(s.language is None for s in fixed) and "Morgen" not in " ".join(s.text for s in fixed)
    with pytest.raises(ValueError, match="sequential"):
        replace(plain, multilingual=True, strategy="chunked")
