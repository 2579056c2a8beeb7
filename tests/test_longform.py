"""Long-form transcription on a 75 s recording built from the LibriVox clips.

The fixture (`specasr.longform_bench.long_recording`) is the five clips twice over,
separated by 2-3 s of silence, so every clip's start and end time is known. One decode per
strategy and mode is shared by the tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import with_self_draft, write_corpus

from benchmarks.longform import LongRecording, long_recording
from specasr.eval.metric import wer
from specasr.longform import engine as engine_module
from specasr.longform import windows as longform
from specasr.longform.engine import LocalEngine
from specasr.longform.windows import is_silence, needs_fallback, split_window
from specasr.options import TranscribeOptions
from specasr.results import DecodeResult, Segment, compression_ratio
from specasr.stats import DecodeStats
from specasr.transcription import transcribe

SR = 16000


@pytest.fixture(scope="module")
def long_audio(librivox) -> LongRecording:
    rec = long_recording(librivox[0].path.parent)
    assert len(rec.samples) / SR >= 60 and rec.texts == [c.text for c in librivox] * 2
    return rec


def _opts(mode: str = "autoregressive", **kw) -> TranscribeOptions:
    base = TranscribeOptions(**kw)
    return base.with_decode(mode=mode)


def _run(pair, audio: np.ndarray, options: TranscribeOptions):
    segments, info = transcribe(audio, pair, options, source_rate=SR)
    return list(segments), info


@pytest.fixture(scope="module")
def sequential_ar(tiny_en_pair, long_audio):
    return _run(tiny_en_pair, long_audio.samples, _opts())


@pytest.fixture(scope="module")
def sequential_spec(tiny_en_pair, long_audio):
    return _run(with_self_draft(tiny_en_pair, 2), long_audio.samples, _opts("exact"))


@pytest.fixture(scope="module")
def chunked_ar(tiny_en_pair, long_audio):
    return _run(tiny_en_pair, long_audio.samples, _opts(strategy="chunked", batch_size=2))


def _check_timeline(segments, duration: float) -> None:
    assert segments
    assert [s.id for s in segments] == list(range(len(segments)))
    for prev, seg in zip(segments, segments[1:]):
        assert prev.start <= seg.start and prev.end <= seg.start + 1e-6, (prev, seg)
    assert all(0 <= s.start < s.end <= duration + 1e-6 for s in segments)


def _covered(segments, t: float) -> bool:
    return any(s.start <= t <= s.end for s in segments)


def test_sequential_segments_are_monotonic_and_cover_the_speech(sequential_ar, long_audio):
    segments, info = sequential_ar
    _check_timeline(segments, info.duration)
    for start, end in long_audio.clips:
        assert all(_covered(segments, t) for t in np.arange(start + 0.5, end - 0.5, 0.25)), (start, end)


def test_sequential_boundaries_match_the_clips(sequential_ar, long_audio):
    segments, _ = sequential_ar
    starts = [s.start for s in segments]
    ends = [s.end for s in segments]
    clips = long_audio.clips
    for k, (start, end) in enumerate(clips):
        assert min(abs(s - start) for s in starts) <= 1.0, (k, start, starts)
        assert min(abs(e - end) for e in ends) <= 1.0, (k, end, ends)
    # no segment runs on into a pause: every end lies in speech or within 1 s after it
    assert all(any(a <= e <= b + 1.0 for a, b in clips) for e in ends), (ends, clips)
    inside = [s for s in starts if any(a + 1.0 < s < b - 1.0 for a, b in clips)]
    assert len(inside) <= 3, inside  # the rest begin within 1 s of a clip's start


def test_sequential_wer(sequential_ar, long_audio):
    segments, _ = sequential_ar
    score = wer([" ".join(long_audio.texts)], [" ".join(s.text for s in segments)])
    print(f"tiny.en sequential long-form WER: {score:.3%}")
    assert score <= 0.15


def test_speculative_long_form_is_identical_at_t0(sequential_ar, sequential_spec):
    ar, _ = sequential_ar
    spec, info = sequential_spec
    assert [(s.start, s.end, s.tokens, s.text) for s in spec] == [
        (s.start, s.end, s.tokens, s.text) for s in ar
    ]
    assert info.stats.proposed > 0 and info.stats.accepted > 0
    assert all(s.stats.proposed > 0 and s.temperature == 0.0 for s in spec)
    assert info.draft == "self:2"


def test_chunked_wer_is_close_to_sequential(chunked_ar, sequential_ar, long_audio):
    ref = [" ".join(long_audio.texts)]
    seq = wer(ref, [" ".join(s.text for s in sequential_ar[0])])
    chunks, info = chunked_ar
    score = wer(ref, [" ".join(s.text for s in chunks)])
    print(f"tiny.en long-form WER: sequential {seq:.3%}, chunked {score:.3%}")
    assert score <= seq + 0.03  # tiny.en, 71 words: one word is 1.4 points (base: tests/test_chunked_loss.py)
    _check_timeline(chunks, info.duration)
    assert info.windows >= 3 and len({s.window for s in chunks}) >= 3
    # the spans are cut in the pauses between clips: no segment holds speech of two clips
    for s in chunks:
        held = [(a, b) for a, b in long_audio.clips if min(s.end, b) - max(s.start, a) > 0.5]
        assert len(held) <= 1, (s.start, s.end, s.text, held)


@pytest.mark.parametrize("strategy", ["sequential", "chunked"])
def test_without_timestamps_each_window_is_one_segment_and_speculation_stays_exact(
    tiny_en_pair, long_audio, sequential_ar, strategy
):
    """`--without-timestamps`: text tokens only, one segment per window that spans it (the
    chunked strategy's windows end in pauses), the same tokens in exact mode as
    autoregressive, and the words of the timestamped decode."""
    opts = _opts(strategy=strategy, batch_size=4).with_decode(timestamps=False)
    ar, info = _run(tiny_en_pair, long_audio.samples, opts)
    draft = with_self_draft(tiny_en_pair, 2)
    spec, spec_info = _run(draft, long_audio.samples, opts.with_decode(mode="exact"))
    assert [(s.start, s.end, s.tokens) for s in spec] == [(s.start, s.end, s.tokens) for s in ar]
    assert spec_info.stats.proposed > 0
    ts_begin = tiny_en_pair.tokenizer.timestamp_begin
    assert all(t < ts_begin for s in ar for t in s.tokens)
    _check_timeline(ar, info.duration)
    assert len(ar) == len({s.window for s in ar}) == info.windows >= 3
    for a, b in long_audio.clips:  # every clip is inside a segment
        assert _covered(ar, (a + b) / 2), (a, b)
    ref = [" ".join(long_audio.texts)]
    stamped = wer(ref, [" ".join(s.text for s in sequential_ar[0])])
    assert wer(ref, [" ".join(s.text for s in ar)]) <= stamped + 0.03


def test_info_and_segment_fields(sequential_ar, long_audio, tiny_en_pair):
    segments, info = sequential_ar
    tb = tiny_en_pair.tokenizer.timestamp_begin
    assert info.language == "en" and not info.language_detected
    assert info.duration == pytest.approx(long_audio.samples.size / SR)
    assert info.windows >= 3 and info.stats.encoder_s > 0 and info.stats.target_calls > 0
    for s in segments:
        assert s.text.strip() and -1.0 < s.avg_logprob < 0 and 0 <= s.no_speech_prob < 0.6
        assert 0 < s.compression_ratio < 2.4
        assert s.tokens[0] >= tb and s.tokens[-1] >= tb  # a segment is <|start|> text <|end|>
        d = s.to_dict()
        assert d["stats"]["proposed"] == 0 and d["text"] == s.text


def test_transcribe_is_lazy(tiny_en_pair, long_audio, monkeypatch):
    calls = []
    real = engine_module.decode_states
    monkeypatch.setattr(engine_module, "decode_states", lambda *a, **k: calls.append(1) or real(*a, **k))
    segments, info = transcribe(long_audio.samples, tiny_en_pair, _opts(), source_rate=SR)
    assert not calls and info.windows == 0
    first = next(segments)
    assert len(calls) == 1 and info.windows == 1 and first.id == 0


# ---- prompts, fallback and silence, through a spy on decode_states (conftest's `spy`) -------------
def test_condition_on_previous_text_and_initial_prompt(tiny_en_pair, long_audio, spy):
    audio = long_audio.samples[: 40 * SR]  # two windows
    tok = tiny_en_pair.tokenizer
    segments, _ = _run(tiny_en_pair, audio, _opts(initial_prompt="Sense and Sensibility."))
    assert len(spy) == 2
    first_prompt = tok.encode(" Sense and Sensibility.")
    assert spy[0][1] == first_prompt
    first_window = [t for s in segments if s.window == 0 for t in s.tokens]
    assert spy[1][1] == first_prompt + first_window
    spy.clear()
    _run(tiny_en_pair, audio, _opts(condition_on_previous_text=False))
    assert len(spy) >= 2 and all(prompt is None for _, prompt in spy)


def test_fallback_reuses_the_encoder_and_resets_the_prompt(tiny_en_pair, long_audio, spy, monkeypatch):
    encodes = []
    real = tiny_en_pair.encode
    monkeypatch.setattr(tiny_en_pair, "encode", lambda mel: encodes.append(mel.shape[0]) or real(mel))
    audio = long_audio.samples[: 40 * SR]
    # an unreachable log-prob bar: every window tries every temperature
    opts = _opts(temperatures=(0.0, 0.6), logprob_threshold=0.0, no_speech_threshold=None)
    segments, info = _run(tiny_en_pair, audio, opts)
    assert [o.temperature for o, _ in spy] == [0.0, 0.6] * info.windows
    assert len(encodes) == info.windows  # one encoder pass per window, whatever the fallbacks
    assert segments and all(s.temperature == 0.6 for s in segments)
    assert all(prompt is None for _, prompt in spy)  # decoded above 0.5: no window prompts the next


def test_a_prompt_that_fails_every_temperature_is_dropped(tiny_en_pair, long_audio, monkeypatch):
    from specasr.longform import sequential as seq_module

    calls = []
    real = engine_module.decode_states

    def record(pair, target_states, draft_states, options, prompt=None, stats=None):
        calls.append((options.temperature, prompt is not None))
        results = real(pair, target_states, draft_states, options, prompt, stats)
        for r in results:
            r.prompted = prompt is not None  # the stand-in below fails every prompted decode
        return results

    def prompted(result, options):
        return result.prompted

    monkeypatch.setattr(engine_module, "decode_states", record)
    monkeypatch.setattr(longform, "needs_fallback", prompted)
    monkeypatch.setattr(seq_module, "needs_fallback", prompted)
    audio = long_audio.samples[: 40 * SR]  # two windows: the second is prompted with the first's text
    segments, info = _run(tiny_en_pair, audio, _opts(temperatures=(0.0, 0.2)))
    # window 1: T=0 passes; window 2: both temperatures fail under the prompt, then T=0 without it
    assert calls[:4] == [(0.0, False), (0.0, True), (0.2, True), (0.0, False)]
    assert all(not was_prompted for _, was_prompted in calls[4:])  # nor does it prompt the next window
    second = [s for s in segments if s.window == 1]
    assert second and all(s.temperature == 0.0 for s in second)


def test_silence_is_skipped(tiny_en_pair):
    rng = np.random.default_rng(0)
    hiss = (1e-4 * rng.standard_normal(35 * SR)).astype(np.float32)  # peaks near -68 dBFS
    segments, info = _run(tiny_en_pair, hiss, _opts(silence_peak=None))  # Whisper's no-speech skip
    assert segments == [] and info.windows >= 1
    segments, info = _run(tiny_en_pair, hiss, _opts())  # under the gate: not even decoded
    assert segments == [] and info.windows == 0


def test_language_detection_and_translate(base_pair, librivox, spy):
    opts = _opts()
    segments, info = transcribe(librivox[0].path, base_pair, opts.with_decode(language=None))
    assert info.language == "en" and info.language_detected
    translate = opts.with_decode(language="en", task="translate")
    segments, info = transcribe(librivox[1].path, base_pair, translate)
    text = " ".join(s.text for s in segments)
    assert spy[-1][0].task == "translate" and wer([librivox[1].text], [text]) <= 0.3


def test_translate_needs_a_multilingual_model(tiny_en_pair, librivox):
    opts = _opts()
    with pytest.raises(ValueError, match="English-only"):
        transcribe(librivox[0].path, tiny_en_pair, opts.with_decode(task="translate"))


# ---- pure functions ------------------------------------------------------------------------
TB = 50363  # <|0.00|> of the English-only vocabulary


def test_split_window_cases():
    a, b, c = 11, 12, 13  # text tokens
    # two closed segments, ending on a closed pair: seek to the last timestamp
    toks = [TB, a, TB + 100, TB + 100, b, TB + 200, TB + 210]
    pieces, advance = split_window(toks, TB, 3000)
    assert [(s, e) for s, e, _ in pieces] == [(0, 100), (100, 200)] and advance == 400
    # ends on a single timestamp: the window is done
    toks = [TB, a, TB + 100, TB + 120, b, TB + 300]
    pieces, advance = split_window(toks, TB, 3000)
    assert [(s, e) for s, e, _ in pieces] == [(0, 100), (120, 300)] and advance == 3000
    # the last segment is cut off: it is decoded again from its start
    toks = [TB, a, TB + 100, TB + 100, b, c]
    pieces, advance = split_window(toks, TB, 3000)
    assert [p[2] for p in pieces] == [[TB, a, TB + 100]] and advance == 200
    # no closed pair: one segment for the whole window
    pieces, advance = split_window([a, b], TB, 1200)
    assert pieces == [(0, 600, [a, b])] and advance == 1200


def _result(text="hello there", avg_logprob=-0.3, no_speech_prob=0.1) -> DecodeResult:
    return DecodeResult([], text, avg_logprob, no_speech_prob, 0.0, "en", DecodeStats())


def test_fallback_and_silence_rules():
    opts = TranscribeOptions()
    assert compression_ratio("the cat " * 40) > 2.4 > compression_ratio("a plain sentence of words")
    assert not needs_fallback(_result(), opts)
    assert needs_fallback(_result(text="the cat " * 40), opts)
    assert needs_fallback(_result(avg_logprob=-1.5), opts)
    assert not needs_fallback(_result(avg_logprob=-1.5, no_speech_prob=0.9), opts)  # silence
    assert is_silence(_result(avg_logprob=-1.5, no_speech_prob=0.9), opts)
    assert not is_silence(_result(avg_logprob=-0.2, no_speech_prob=0.9), opts)  # confident speech
    assert not is_silence(_result(avg_logprob=-1.5, no_speech_prob=0.3), opts)


def test_options_are_validated():
    for bad in (
        {"strategy": "magic"},
        {"temperatures": ()},
        {"temperatures": (0.4, 0.2)},
        {"batch_size": 0},
        {"cut_search": 25.0},
        {"no_speech_threshold": 1.5},
    ):
        with pytest.raises(ValueError):
            TranscribeOptions(**bad)


def test_batched_fallback_redecodes_only_the_failing_rows(tiny_en_pair, long_audio, spy, monkeypatch):
    from specasr.constants import N_SAMPLES
    from specasr.features import log_mel

    pair = with_self_draft(tiny_en_pair, 2)  # shared encoder: draft states are the target's
    mel = log_mel(long_audio.samples, 80, padding=N_SAMPLES)[0]
    windows = torch.cat([longform.window_mel(mel, s, 3000) for s in (0, 3000)])  # [2, 80, 3000]
    stats = DecodeStats()
    t_states, d_states = longform.encode_windows(LocalEngine(pair), windows, stats)
    assert d_states is t_states
    # only the second window (30-60 s) holds "amiable himself"
    monkeypatch.setattr(longform, "needs_fallback", lambda result, options: "amiable himself" in result.text)
    opts = _opts("exact", temperatures=(0.0, 0.2))
    results = longform.decode_with_fallback(LocalEngine(pair), t_states, d_states, opts, "en", None, 0, stats)
    assert results[0].temperature == 0.0 and "amiable himself" not in results[0].text
    assert results[1].temperature == 0.2 and "amiable himself" in results[1].text
    assert [o.temperature for o, _ in spy] == [0.0, 0.2]
    assert stats.proposed > 0


def test_cut_spans_ends_spans_in_pauses():
    from specasr.longform.chunked import cut_spans

    level = torch.zeros(7000)
    level[2400:2460] = -1.0  # a 0.6 s pause 24 s in
    level[5100:5160] = -1.0  # and one 51 s in (27 s after the first cut)
    spans = cut_spans(level, search=10.0)
    assert [a for a, _ in spans] == [0, spans[0][1], spans[1][1]] and spans[-1][1] == 7000
    assert 2400 <= spans[0][1] < 2460 and 5100 <= spans[1][1] < 5160
    assert all(b - a <= 3000 for a, b in spans)
    # no pause in reach: the quietest point of the last search window; search 0: fixed 30 s spans
    assert cut_spans(torch.zeros(7000), search=0.0) == [(0, 3000), (3000, 6000), (6000, 7000)]
    # joins (where VAD's speech chunks meet) win over any pause: the last one that fits
    assert cut_spans(level, search=10.0, joins=[800, 1900, 3300])[:2] == [(0, 1900), (1900, 3300)]
    assert cut_spans(torch.zeros(1200), search=10.0) == [(0, 1200)]


class _Tok:
    eot = 1000

    def decode(self, tokens):
        return "".join(f" w{t}" for t in tokens if t < self.eot)


def _seg(tokens, start=0.0):
    return Segment(0, start, start + 1, _Tok().decode(tokens), tokens, -0.1, 1.0, 0.0, 0.0, 0, DecodeStats())


def test_drop_repeat_removes_what_the_lane_said_already():
    from specasr.longform.chunked import drop_repeat

    tok = _Tok()
    said = [1, 2, 3, 4, 5]
    # the follow-up window opens with the lane's last three tokens: they go, with a segment emptied by it
    segments = [_seg([1001, 3, 4, 1002]), _seg([1002, 5, 6, 7, 1003], 1.0)]
    out = drop_repeat(segments, said, tok.eot, tok)
    assert [s.tokens for s in out] == [[1002, 6, 7, 1003]] and out[0].text == " w6 w7"
    # two tokens are too few to call a repeat; a repeat that is not a suffix is kept
    assert drop_repeat([_seg([4, 5, 9])], said, tok.eot, tok)[0].tokens == [4, 5, 9]
    assert drop_repeat([_seg([2, 3, 4, 9])], said, tok.eot, tok)[0].tokens == [2, 3, 4, 9]


def _corpus(root, librivox, n: int = 2):
    """n LibriVox clips as source librivox:en, and one record of another source."""
    rows = [(c.path, "librivox:en" if i < n else "other:en", c.text) for i, c in enumerate(librivox[: n + 1])]
    return write_corpus(root, rows)


def test_a_corpus_recording_joins_one_sources_windows_with_silences(tmp_path, librivox):
    import click

    from benchmarks.longform import corpus_recording

    rec, language = corpus_recording(_corpus(tmp_path, librivox), "librivox:en", 5, gap=1.0)
    assert language == "en" and rec.texts == [c.text for c in librivox[:2]]
    (a0, b0), (a1, b1) = rec.clips
    assert a0 == 0 and a1 == pytest.approx(b0 + 1.0) and b1 + 1.0 == pytest.approx(len(rec.samples) / SR)
    assert not np.any(rec.samples[int(b0 * SR) + 10 : int(a1 * SR) - 10])  # the gap is silence
    with pytest.raises(click.BadParameter, match="no windows"):
        corpus_recording(tmp_path, "fillets:nl", 5)


@pytest.mark.slow  # four long-form decodes with tiny.en
def test_the_long_form_benchmark_runs_on_a_held_out_corpus(tmp_path, librivox):
    from click.testing import CliRunner

    from benchmarks import longform as bench

    args = ["--corpus", str(_corpus(tmp_path, librivox)), "--source", "librivox:en", "--repeats", "1"]
    result = CliRunner().invoke(bench.main, [*args, "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    assert "identical to autoregressive at T=0: sequential yes, chunked yes" in result.output
    rows = [
        r for r in result.output.splitlines() if r.startswith("| sequential") or r.startswith("| chunked")
    ]
    assert len(rows) == 4
    assert all(float(r.split("|")[-2].strip().rstrip("%")) < 30 for r in rows)  # WER, tiny.en


@pytest.mark.parametrize("name, dtype", [(None, None), ("fp32", torch.float32), ("fp16", torch.float16)])
def test_the_long_form_benchmark_loads_the_dtype_it_is_given(monkeypatch, tmp_path, librivox, name, dtype):
    """`--dtype` reaches `load_pair` (fp32 on CUDA, where fp16 can flip a near-tie); unset, the
    device's default (None)."""
    from click.testing import CliRunner

    from benchmarks import longform as bench
    from specasr.models import loading

    seen = []

    def fake_load_pair(*args, **kwargs):
        seen.append(kwargs)
        raise RuntimeError("loaded")

    monkeypatch.setattr(loading, "load_pair", fake_load_pair)
    args = ["--corpus", str(_corpus(tmp_path, librivox)), "--source", "librivox:en", "--repeats", "1"]
    result = CliRunner().invoke(bench.main, args + (["--dtype", name] if name else []))
    assert isinstance(result.exception, RuntimeError) and str(result.exception) == "loaded"
    assert seen == [dict(device="cpu", dtype=dtype, compute_type="float32")]
    assert CliRunner().invoke(bench.main, [*args, "--dtype", "fp8"]).exit_code == 2


@pytest.mark.slow  # loads base; runs espeak-ng (CI installs it)
def test_the_library_detects_the_language_by_default(base_pair, tmp_path):
    """`transcribe(path, pair)` with its default options detects the language, as the CLI
    does: German speech comes out in German, not forced through English."""
    import subprocess

    wav = tmp_path / "de.wav"
    text = "Guten Morgen, wie geht es Ihnen heute? Das Wetter ist sehr schön."
    speech = ["espeak-ng", "-v", "de", "-s", "150", "--stdout", text]
    wav.write_bytes(subprocess.run(speech, capture_output=True, check=True).stdout)
    segments, info = transcribe(wav, with_self_draft(base_pair, 2))  # options: all defaults
    said = "".join(s.text for s in segments).lower()
    assert (info.language, info.language_detected) == ("de", True)
    assert "guten morgen" in said and "wie geht es" in said
    # faster-whisper's fields: the language's probability, every language's (most likely first)
    assert info.all_language_probs[0] == ("de", info.language_probability)
    assert info.language_probability > 0.5
    assert len(info.all_language_probs) > 90 and abs(sum(p for _, p in info.all_language_probs) - 1) < 1e-4
    assert info.duration_after_vad is None  # no VAD asked for


@pytest.mark.slow  # tiny.en, 75 s once per strategy (gated: the shared decodes above)
@pytest.mark.parametrize("strategy", ["sequential", "chunked"])
def test_the_silence_gate_drops_no_speech(tiny_en_pair, long_audio, strategy, request):
    """The fixture's speech, its pauses included, decodes to the same segments with the
    digital-silence gate on (the default) and off: no window of it is quiet enough."""
    on = request.getfixturevalue("sequential_ar" if strategy == "sequential" else "chunked_ar")
    batch = {} if strategy == "sequential" else {"batch_size": 2}  # chunked_ar's
    off = _run(tiny_en_pair, long_audio.samples, _opts(strategy=strategy, silence_peak=None, **batch))
    assert [(s.start, s.end, s.text) for s in on[0]] == [(s.start, s.end, s.text) for s in off[0]]
    assert on[1].windows == off[1].windows > 0


@pytest.mark.slow  # tiny.en
@pytest.mark.parametrize("strategy", ["sequential", "chunked"])
def test_digital_silence_gives_no_text(tiny_en_pair, librivox, strategy):
    """Ten minutes of zeros give no segment and decode no window; speech after a silent minute
    is heard at its time. Ungated, Whisper decodes the zeros (and hears words in them)."""
    from specasr.audio import load_audio

    zeros = np.zeros(600 * SR, np.float32)
    segments, info = _run(tiny_en_pair, zeros, _opts(strategy=strategy))
    assert segments == [] and info.windows == 0
    ungated = _run(tiny_en_pair, zeros[: 60 * SR], _opts(strategy=strategy, silence_peak=None))
    assert ungated[1].windows >= 2  # 60 s: two windows, or more spans when chunked
    speech = load_audio(librivox[0].path)
    after = np.concatenate([zeros[: 60 * SR], speech])
    segments, info = _run(tiny_en_pair, after, _opts(strategy=strategy))
    assert segments and segments[0].start >= 30.0  # the first window, all zeros, is not decoded
    assert "dashwood" in " ".join(s.text for s in segments).lower()  # (the clip's own words)
