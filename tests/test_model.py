"""`WhisperModel` (specasr/model.py): faster-whisper's call shape over `load_pair` and `transcribe`.

The fast tests load a random tiny pair in place of `load_pair`'s and read the options a call
builds (`info` is ready before any window is decoded); the slow ones run the README's snippet
on a LibriVox clip with the packaged `base` once per module and compare it with
`specasr.transcribe`.
"""

from __future__ import annotations

import io
import re
from dataclasses import replace
from pathlib import Path

import pytest
import soundfile as sf
import torch
from tiny_pairs import random_tiny_pair

import specasr
from specasr import model as model_module
from specasr.backends.cpu import set_threads
from specasr.model import WhisperModel, vad_options
from specasr.options import FALLBACK_TEMPERATURES, TranscribeOptions, VadOptions
from specasr.transcription import transcribe

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def tiny_pair():
    return random_tiny_pair(seed=11)


@pytest.fixture()
def loads(tiny_pair, monkeypatch):
    """`load_pair`'s calls from WhisperModel, each recorded with torch's thread count at the
    time, answered with the random tiny pair (its draft dropped for draft=None)."""
    calls = []

    def fake(target, draft, **kwargs):
        calls.append({"target": target, "draft": draft, "threads": torch.get_num_threads(), **kwargs})
        return tiny_pair if draft is not None else replace(tiny_pair, draft=None, draft_name=None)

    monkeypatch.setattr(model_module, "load_pair", fake)
    return calls


def options_of(model: WhisperModel, clip, **kwargs) -> TranscribeOptions:
    segments, info = model.transcribe(clip, language="en", **kwargs)
    segments.close()  # nothing decoded: only the options are compared
    return info.options


def test_whisper_model_is_a_lazy_top_level_name():
    assert specasr.WhisperModel is WhisperModel
    assert "WhisperModel" in specasr.__all__


def test_compute_types_map_onto_the_projects_and_others_are_refused(loads):
    WhisperModel("base", device="cpu")
    WhisperModel("base", device="cpu", compute_type="int8_float32")
    WhisperModel("base", device="cpu", compute_type="float32")
    got = [(c["compute_type"], c["dtype"], c["device"]) for c in loads]
    cpu = torch.device("cpu")
    assert got == [("float32", None, cpu), ("int8", None, cpu), ("float32", torch.float32, cpu)]
    assert loads[0]["target"] == "base" and loads[0]["draft"] == "default"
    with pytest.raises(ValueError, match="compute_type must be one of .*'default'.*'int8_bfloat16'"):
        WhisperModel("base", compute_type="int8_float16")
    with pytest.raises(ValueError, match="float16 runs on CUDA"):
        WhisperModel("base", device="cpu", compute_type="float16")
    with pytest.raises(ValueError, match="device must be one of"):
        WhisperModel("base", device="tpu")
    assert len(loads) == 3  # the refusals came before a load


def test_cpu_threads_set_torchs_before_the_load():
    before = torch.get_num_threads()
    want = 1 if before != 1 else 2
    seen = []
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(model_module, "load_pair", lambda *a, **k: seen.append(torch.get_num_threads()))
            with pytest.raises(AttributeError):  # the fake load returns no pair
                WhisperModel("base", cpu_threads=want)
        assert seen == [want] and torch.get_num_threads() == want  # the C draft step reads it at load
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="cpu_threads"):
        WhisperModel("base", cpu_threads=-1)
    with pytest.raises(ValueError, match="threads must be a whole number >= 1"):
        set_threads(0)
    assert torch.get_num_threads() == before


def test_mode_follows_the_draft_unless_given(loads):
    assert WhisperModel("base").mode == "exact"
    assert WhisperModel("base", draft=None).mode == "autoregressive"
    with pytest.raises(ValueError, match="needs a draft"):
        WhisperModel("base", draft=None, mode="exact")
    with pytest.raises(ValueError, match="mode must be one of"):
        WhisperModel("base", mode="fastest")


def test_default_call_builds_the_default_options(loads, librivox):
    model = WhisperModel("base")
    segments, info = model.transcribe(librivox[0].path)
    segments.close()
    # language detected, the fallback schedule, exact, and faster-whisper's search: 5 beams at
    # T = 0, 5 samples above, its length_penalty 1 = specasr's plain length normalisation (None)
    assert info.options == TranscribeOptions().with_decode(beam_size=5, best_of=5)
    assert (info.options.decode.patience, info.options.decode.length_penalty) == (1, None)
    assert info.language_detected and info.draft == model.pair.draft_name


def test_faster_whispers_keywords_set_the_fields_they_name(loads, librivox):
    model = WhisperModel("base")
    clip = librivox[0].path
    o = options_of(
        model,
        clip,
        task="translate",
        temperature=0.4,
        initial_prompt="Dashwood.",
        condition_on_previous_text=False,
        compression_ratio_threshold=None,
        log_prob_threshold=-2.0,
        no_speech_threshold=0.5,
        word_timestamps=True,
        without_timestamps=True,
        prompt_reset_on_temperature=0.3,
    )
    assert o.temperatures == (0.4, 0.6, 0.8, 1.0) and o.decode.temperature == 0.4
    assert (o.decode.task, o.decode.language, o.decode.timestamps) == ("translate", "en", False)
    assert (o.initial_prompt, o.condition_on_previous_text, o.word_timestamps) == ("Dashwood.", False, True)
    assert (o.compression_ratio_threshold, o.logprob_threshold, o.no_speech_threshold) == (None, -2.0, 0.5)
    assert o.prompt_reset_temperature == 0.3
    assert options_of(model, clip, temperature=[0.2, 0.5]).temperatures == (0.2, 0.5)
    assert options_of(model, clip, temperature=(0.0, 1.0)).decode.temperature == 0.0
    assert options_of(model, clip).temperatures == FALLBACK_TEMPERATURES


def test_other_keywords_pass_through_to_the_options_fields(loads, librivox):
    model = WhisperModel("base")
    clip = librivox[0].path
    o = options_of(model, clip, mode="autoregressive", strategy="chunked", gamma=5, seed=1, batch_size=3)
    assert (o.decode.mode, o.decode.gamma, o.decode.seed) == ("autoregressive", 5, 1)
    assert (o.strategy, o.batch_size) == ("chunked", 3)
    _, info = model.transcribe(clip, language="en", mode="autoregressive")
    assert info.draft is None
    # faster-whisper's types where a field of the same name has another
    o = options_of(model, clip, suppress_tokens=[-1, 220], clip_timestamps="1.5,4")
    assert (o.decode.suppress_tokens, o.decode.suppress_ids, o.clip_timestamps) == (True, (220,), (1.5, 4.0))
    o = options_of(model, clip, suppress_tokens=[], clip_timestamps=[0.5, 2.0])
    assert (o.decode.suppress_tokens, o.decode.suppress_ids, o.clip_timestamps) == (False, (), (0.5, 2.0))
    with pytest.raises(ValueError, match="gamma"):  # the fields' own checks still run
        model.transcribe(clip, gamma=0)


def test_faster_whispers_search_keywords_set_the_decode_options(loads, librivox):
    model = WhisperModel("base")
    clip = librivox[0].path
    d = options_of(model, clip, beam_size=3, best_of=2, patience=2.0, length_penalty=0.5).decode
    assert (d.beam_size, d.best_of, d.patience, d.length_penalty) == (3, 2, 2.0, 0.5)
    d = options_of(model, clip, beam_size=1, best_of=1, length_penalty=0.0).decode
    assert (d.beam_size, d.best_of, d.length_penalty) == (1, 1, 0.0)  # greedy; α = 0 is not 1
    assert options_of(model, clip, length_penalty=None).decode.length_penalty is None
    # DecodeOptions' checks, before anything is decoded
    for bad, match in [
        ({"beam_size": 0}, "beam_size must be a whole number in \\[1, 16\\]"),
        ({"best_of": 17}, "best_of must be"),
        ({"patience": 0}, "patience must be a finite number > 0"),
        ({"length_penalty": 2.0}, "length_penalty must be within \\[0, 1\\]"),
    ]:
        with pytest.raises(ValueError, match=match):
            model.transcribe(clip, **bad)


def test_unknown_keywords_are_refused(loads, librivox):
    model = WhisperModel("base")
    clip = librivox[0].path
    with pytest.raises(TypeError, match="'no_such_option'"):
        model.transcribe(clip, no_such_option=1)
    with pytest.raises(TypeError, match="temperatures from temperature"):
        model.transcribe(clip, temperatures=(0.0,))
    with pytest.raises(TypeError, match="logprob_threshold from log_prob_threshold"):
        model.transcribe(clip, logprob_threshold=-2.0)


def test_vad_parameters_by_faster_whispers_names():
    fw = {
        "threshold": 0.6,
        "neg_threshold": 0.3,
        "min_speech_duration_ms": 100,
        "min_silence_duration_ms": 500,
        "speech_pad_ms": 200,
        "max_speech_duration_s": 20.0,
    }
    want = VadOptions(
        threshold=0.6,
        neg_threshold=0.3,
        min_speech=0.1,
        min_silence=0.5,
        speech_pad=0.2,
        max_speech_duration_s=20.0,
    )
    assert vad_options(fw) == want
    assert vad_options({"min_silence": 0.5}) == VadOptions(min_silence=0.5)  # specasr's own names
    assert vad_options(None) == VadOptions() and vad_options(want) is want
    with pytest.raises(TypeError, match="'window_size_samples'"):
        vad_options({"window_size_samples": 512})
    faster_whisper_vad = pytest.importorskip("faster_whisper.vad")
    theirs = vad_options(faster_whisper_vad.VadOptions(**fw))
    assert theirs == want


def test_vad_filter_sets_the_vad_options(loads, librivox):
    model = WhisperModel("base")
    params = {"min_silence_duration_ms": 300, "speech_pad_ms": 100}
    o = options_of(model, librivox[0].path, vad_filter=True, vad_parameters=params)
    assert o.vad == VadOptions(min_silence=0.3, speech_pad=0.1)
    assert options_of(model, librivox[0].path, vad_parameters=params).vad is None  # as faster-whisper


# ---- the packaged `base`, through the README's snippet ---------------------------------------
def readme_snippet() -> str:
    section = README.read_text(encoding="utf-8").split("## Python API", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    (snippet,) = [b for b in blocks if "WhisperModel(" in b]
    return snippet


@pytest.fixture(scope="module")
def readme(librivox):
    """The README's WhisperModel snippet as written, run on the shortest LibriVox clip: its
    variables (model, segments, info, text) and the clip."""
    clip = min(librivox, key=lambda c: sf.info(c.path).duration)
    snippet = readme_snippet()
    assert '"talk.wav"' in snippet and 'text = "".join(s.text for s in segments)' in snippet
    scope: dict = {}
    exec(compile(snippet.replace('"talk.wav"', repr(str(clip.path))), "README.md", "exec"), scope)
    return scope, clip


def texts(segments) -> str:
    return "".join(s.text for s in segments)


@pytest.mark.slow
def test_the_readme_snippet_gives_specasrs_transcript(readme):
    scope, clip = readme
    model, info = scope["model"], scope["info"]
    # faster-whisper's defaults: specasr's own but for the search (the snippet asks for greedy;
    # 5 samples above T = 0)
    assert info.options == TranscribeOptions().with_decode(best_of=5)
    segments, expected = transcribe(clip.path, model.pair, info.options)  # specasr.transcribe
    assert scope["text"] == texts(segments) and scope["text"].strip()
    assert re.sub(r"[^a-z ]+", " ", scope["text"].lower()).split() == clip.text.split()  # the reference
    assert info.options == expected.options
    assert info.language == "en" and info.language_detected and 0.5 < info.language_probability <= 1
    assert info.draft == model.pair.draft_name and info.draft is not None


@pytest.mark.slow
def test_detect_language_is_transcribes_detection(readme):
    scope, clip = readme
    info = scope["info"]
    language, probability, ranked = scope["model"].detect_language(clip.path)
    assert (language, probability, ranked) == (
        info.language,
        info.language_probability,
        info.all_language_probs,
    )
    assert len(ranked) > 50 and ranked[0] == ("en", probability)


@pytest.mark.slow
def test_arrays_bytes_and_file_objects_give_the_paths_text(readme):
    scope, clip = readme
    model = scope["model"]
    samples, rate = sf.read(clip.path, dtype="float32")
    assert rate == 16000
    assert texts(model.transcribe(samples)[0]) == scope["text"]  # no source rate: 16 kHz, as faster-whisper
    with open(clip.path, "rb") as f:
        assert texts(model.transcribe(f)[0]) == scope["text"]
    assert texts(model.transcribe(io.BytesIO(clip.path.read_bytes()))[0]) == scope["text"]


@pytest.mark.slow
def test_autoregressive_pass_through_keeps_the_text_without_the_draft(readme):
    scope, clip = readme
    segments, info = scope["model"].transcribe(clip.path, mode="autoregressive", beam_size=1)
    assert texts(segments) == scope["text"]
    assert info.draft is None and info.options.decode.mode == "autoregressive"
    assert info.stats.draft_calls == 0 and scope["info"].stats.draft_calls > 0
