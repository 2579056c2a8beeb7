"""Word timestamps (longform/words.py): DTW, the median filter, word splitting, alignment
heads, cross-attention against transformers, the timer's invariants; on real weights (slow):
words of exact decoding equal those of autoregressive decoding, and lie inside their clips."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import with_self_draft
from scipy.ndimage import median_filter as scipy_median
from tiny_pairs import random_tiny_pair

from benchmarks.longform import long_recording
from specasr.longform import words as W
from specasr.models.loading import offline_files
from specasr.models.whisper import Generation, WhisperDims
from specasr.options import TranscribeOptions
from specasr.results import Segment, TranscriptionInfo
from specasr.stats import DecodeStats
from specasr.tokenizer import Tokenizer
from specasr.transcription import transcribe

SR = 16000


# ---- DTW and the median filter ----------------------------------------------------------------
def _cheapest(cost: np.ndarray) -> float:
    """The reference: the same recurrence, cell by cell."""
    N, M = cost.shape
    D = np.full((N + 1, M + 1), np.inf)
    D[0, 0] = 0
    for i in range(1, N + 1):
        for j in range(1, M + 1):
            D[i, j] = cost[i - 1, j - 1] + min(D[i - 1, j - 1], D[i - 1, j], D[i, j - 1])
    return D[N, M]


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (6, 1), (5, 9), (12, 40), (30, 31)])
def test_dtw_path_is_monotonic_and_cheapest(shape):
    cost = np.random.default_rng(sum(shape)).random(shape).astype(np.float32)
    rows, cols = W.dtw(cost)
    assert (rows[0], cols[0]) == (0, 0) and (rows[-1], cols[-1]) == (shape[0] - 1, shape[1] - 1)
    steps = set(zip(np.diff(rows).tolist(), np.diff(cols).tolist()))
    assert steps <= {(1, 1), (1, 0), (0, 1)}
    assert cost[rows, cols].sum() == pytest.approx(_cheapest(cost), rel=1e-5)


def test_dtw_follows_a_staircase():
    cost = np.ones((3, 9), np.float32)
    for i, (a, b) in enumerate([(0, 2), (2, 5), (5, 9)]):
        cost[i, a:b] = 0
    rows, cols = W.dtw(cost)
    entered = cols[np.diff(rows, prepend=-1) > 0]
    assert entered.tolist() == [0, 2, 5]


def test_median_filter_matches_scipy():
    x = torch.randn(2, 5, 30)
    ours = W.median_filter(x, 7)
    ref = scipy_median(x.numpy(), size=(1, 1, 7), mode="mirror")  # torch's "reflect" is scipy's "mirror"
    np.testing.assert_allclose(ours.numpy(), ref)
    short = torch.randn(4, 3)
    assert torch.equal(W.median_filter(short, 7), short)
    with pytest.raises(ValueError, match="odd"):
        W.median_filter(x, 6)


# ---- words -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def en_tok() -> Tokenizer:
    return Tokenizer.from_file(offline_files("tiny.en").tokenizer)


def test_words_split_at_spaces_and_keep_their_punctuation(en_tok):
    ids = en_tok.encode(' "Hello," she said. (It\'s) over-the-top!')
    words = W.split_words(en_tok, ids, "en")
    assert "".join(t for t, _ in words) == en_tok.decode(ids)
    assert [t for t, _ in words] == [
        ' "Hello,"',
        " she",
        " said",
        ".",
        " (It's",
        ")",
        " over",
        "-the",
        "-top",
        "!",
    ]
    merged = W.merge_punctuation([W._Timed(t, g, 0.0, 0.0) for t, g in words])
    assert [w.text for w in merged] == [' "Hello,"', " she", " said.", " (It's)", " over", "-the", "-top!"]
    assert sorted(k for w in merged for k in w.tokens) == list(range(len(ids)))


def test_the_punctuation_sets_decide_what_joins(en_tok):
    """The joining sets are options: without "," and ":" in `append`, those marks stay words of
    their own; without "-" in `prepend`, a dash no longer joins the word after it."""
    ids = en_tok.encode(' Well, she said: "(no) way" - right.')
    words = [W._Timed(t, g, 0.0, 0.0) for t, g in W.split_words(en_tok, ids, "en")]
    default = [w.text for w in W.merge_punctuation(words)]
    assert default == [" Well,", " she", " said:", ' "(no)', ' way"', " - right."]
    custom = TranscribeOptions(prepend_punctuations='"(', append_punctuations='".)')
    merged = W.merge_punctuation(words, custom.prepend_punctuations, custom.append_punctuations)
    apart = [" Well", ",", " she", " said", ":", ' "(no)', ' way"', " -", " right."]
    assert [w.text for w in merged] == apart
    assert [w.text for w in W.merge_punctuation(words, "", "")] == [w.text for w in words]


def test_unspaced_languages_split_at_whole_characters():
    tok = Tokenizer.from_file(offline_files("base").tokenizer)
    text = "鬱鬱蔥蔥的森林"  # several characters take two byte-level tokens
    ids = tok.encode(text)
    words = W.split_words(tok, ids, "zh")
    assert [t for t, _ in words] == list(text)
    assert any(len(g) > 1 for _, g in words) and [k for _, g in words for k in g] == list(range(len(ids)))


# ---- alignment heads and cross-attention ------------------------------------------------------
def _dims(layers: int, heads: int, d: int, vocab: int) -> WhisperDims:
    return WhisperDims(vocab, 80, d, 4, layers, heads, heads, 4 * d, 4 * d)


def test_alignment_heads_come_from_the_config_then_whisper_then_the_upper_half():
    from types import SimpleNamespace

    base = _dims(6, 8, 512, 51865)
    own = SimpleNamespace(config=base, generation=Generation(alignment_heads=((5, 7), (2, 1))))
    assert W.alignment_heads(own) == ((5, 7), (2, 1))
    known = SimpleNamespace(config=base, generation=Generation())
    assert W.alignment_heads(known) == W.WHISPER_HEADS[(6, 8, 512, 51865)]
    foreign = SimpleNamespace(config=_dims(2, 4, 64, 51865), generation=own.generation)  # does not fit
    assert W.alignment_heads(foreign) == ((1, 0), (1, 1), (1, 2), (1, 3))


@pytest.fixture(scope="module")
def tiny():
    return random_tiny_pair(seed=3)


def test_cross_attention_matches_transformers(tiny):
    from hf_oracle import hf_twin

    twin = hf_twin(tiny.target, tiny.tokenizer)
    twin.set_attn_implementation("eager")  # attention weights are only returned by eager attention
    tok, dec = tiny.tokenizer, tiny.target.model.decoder
    states = torch.randn(2, 1500, 64, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([tok.sot_sequence("en") + tok.encode(" one two three") + [tok.eot]] * 2)
    heads = ((1, 2), (0, 1), (1, 0))
    hidden, scores = dec.cross_attention(ids, states, heads)
    ref = twin.model.decoder(input_ids=ids, encoder_hidden_states=states, output_attentions=True)
    expected = torch.stack([ref.cross_attentions[layer][:, h] for layer, h in heads], dim=1)
    assert scores.shape == (2, 3, ids.shape[1], 1500)
    torch.testing.assert_close(scores.softmax(-1), expected, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(hidden, dec(ids, states))  # the same forward as decoding's
    assert not any(layer.encoder_attn_layer_norm._forward_hooks for layer in dec.layers)
    with pytest.raises(ValueError, match="outside"):
        dec.cross_attention(ids, states, [(2, 0)])


def test_align_times_tokens_from_the_attention(tiny, monkeypatch):
    """Scores whose row k (predicting text token k) peaks at frames [10k, 10k + 10): token k
    then lasts from 0.2·k s to 0.2·(k + 1) s after the window's start."""
    tok, dec = tiny.tokenizer, tiny.target.model.decoder
    text = tok.encode(" one two three four")
    start = tok.sot_sequence("en")
    first, n = len(start) - 1, len(text)
    real = dec.cross_attention

    def crafted(ids, states, heads):
        hidden, _ = real(ids, states, heads)
        scores = torch.zeros(1, len(heads), ids.shape[1], 1500)
        for k in range(n + 1):
            scores[0, :, first + k, 10 * k : 10 * k + 10] = 8.0
        return hidden, scores

    monkeypatch.setattr(dec, "cross_attention", crafted)
    states = torch.randn(1, 1500, 64)
    times = W.align(tiny, states, text, 3000, "en", "transcribe", offset=12.0)
    np.testing.assert_allclose(times.starts, 12.0 + 0.2 * np.arange(n), atol=1e-9)
    np.testing.assert_allclose(times.ends, 12.0 + 0.2 * np.arange(1, n + 1), atol=1e-9)
    assert times.probs.shape == (n,) and ((times.probs > 0) & (times.probs <= 1)).all()


# ---- the timer ----------------------------------------------------------------------------------
def _segment(tok, text: str, start: float, end: float, window: int, ts: tuple[int, int]) -> Segment:
    tokens = [tok.timestamp_begin + ts[0], *tok.encode(text), tok.timestamp_begin + ts[1]]
    return Segment(0, start, end, text, tokens, -0.2, 1.2, 0.01, 0.0, window, DecodeStats())


def _check_words(segments: list[Segment]) -> None:
    t = 0.0
    for seg in segments:
        assert seg.words is not None
        assert "".join(w.word for w in seg.words) == seg.text
        assert seg.start >= t - 1e-9
        for w in seg.words:
            assert seg.start - 1e-9 <= w.start <= w.end <= seg.end + 1e-9, (seg, w)
            assert w.start >= t - 1e-9 and 0 < w.probability <= 1
            t = w.end
        t = max(t, seg.end)


def test_timer_words_lie_in_order_inside_their_segments(tiny):
    tok = tiny.tokenizer
    info = TranscriptionInfo("en", False, 61.0, TranscribeOptions(), "tiny", None)
    timer = W.WordTimer(tiny, TranscribeOptions(word_timestamps=True), info)
    gen = torch.Generator().manual_seed(1)
    windows = {  # window -> (offset, its segments); window 1 is added and attached first (chunked lanes)
        0: (
            0.0,
            [
                _segment(tok, " Hello there.", 0.5, 2.0, 0, (25, 100)),
                _segment(tok, " Bye now!", 2.0, 4.0, 0, (100, 200)),
            ],
        ),
        1: (30.0, [_segment(tok, " A second, later window.", 31.0, 35.0, 1, (50, 250))]),
    }
    attached = {}
    for w in (1, 0):
        offset, segs = windows[w]
        tokens = [t for s in segs for t in s.tokens]
        timer.add(w, torch.randn(1, 1500, 64, generator=gen), offset, 3000, tokens)
        attached[w] = timer.attach(segs)
    stream = list(W.in_order(iter(attached[0] + attached[1])))
    _check_words(stream)
    assert [s.text for s in stream] == [" Hello there.", " Bye now!", " A second, later window."]
    assert all(s.end <= info.duration for s in stream)


def test_in_order_moves_overlaps_forward():
    from specasr.results import Word

    stats = DecodeStats()
    a = Segment(
        0,
        1.0,
        5.0,
        " a b",
        [],
        0,
        0,
        0,
        0,
        0,
        stats,
        words=[Word(" a", 1.0, 2.0, 0.9), Word(" b", 2.0, 5.0, 0.8)],
    )
    b = Segment(1, 4.0, 6.0, " c", [], 0, 0, 0, 0, 1, stats, words=[Word(" c", 3.5, 6.0, 0.7)])
    out = list(W.in_order(iter([a, b])))
    assert (out[1].start, out[1].words[0].start, out[1].words[0].end) == (5.0, 5.0, 6.0)
    assert out[0] == a  # already in order: unchanged


# ---- real weights (slow) ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def recording(librivox):
    return long_recording(librivox[0].path.parent, repeats=1)  # 37 s: two windows


def _words(pair, rec, **kw):
    """rec: a LongRecording or samples (16 kHz)."""
    options = TranscribeOptions(word_timestamps=True, **kw)
    mode = "exact" if pair.draft is not None else "autoregressive"
    samples = rec if isinstance(rec, np.ndarray) else rec.samples
    segments, _ = transcribe(samples, pair, options.with_decode(mode=mode), source_rate=SR)
    return list(segments)


@pytest.fixture(scope="module")
def ar_words(tiny_en_pair, recording):
    return _words(tiny_en_pair, recording)


def test_exact_mode_words_equal_autoregressive_words(tiny_en_pair, recording, ar_words):
    exact = _words(with_self_draft(tiny_en_pair, 2), recording)
    assert [s.tokens for s in exact] == [s.tokens for s in ar_words]
    assert [s.words for s in exact] == [s.words for s in ar_words]  # texts, times and probabilities
    assert [(s.start, s.end) for s in exact] == [(s.start, s.end) for s in ar_words]


@pytest.mark.parametrize("strategy", ["sequential", "chunked"])
def test_real_words_lie_in_their_segments_and_clips(tiny_en_pair, recording, ar_words, strategy):
    segments = ar_words if strategy == "sequential" else _words(tiny_en_pair, recording, strategy="chunked")
    _check_words(segments)
    words = [w for s in segments for w in s.words]
    assert len(words) >= 0.8 * sum(len(t.split()) for t in recording.texts)
    # every word belongs to one clip (the silences between are 2-3 s). Slack, as in Whisper: a
    # window's first word starts with the window (0.5 s before the first clip), and a word before a
    # pause may end up to about 1 s late (tiny.en's attention lingers on it)
    for w in words:
        assert any(a - 0.6 <= w.start < b and w.end <= b + 1.2 for a, b in recording.clips), w


def test_the_punctuation_options_reach_the_words_of_a_real_clip(tiny_en_pair, librivox):
    """TranscribeOptions' joining sets are the word timer's: with none, the clip's full stop
    (and any comma) is a word of its own, timed like the others; the text is the same."""
    clip = long_recording(librivox[0].path.parent, repeats=1).samples[: 8 * SR]
    joined = _words(tiny_en_pair, clip)
    apart = _words(tiny_en_pair, clip, prepend_punctuations="", append_punctuations="")
    assert [s.text for s in apart] == [s.text for s in joined]
    _check_words(apart)
    marks = [w for s in apart for w in s.words if w.word in {".", ","}]
    assert marks and all(0 < w.probability <= 1 for w in marks)
    assert not any(w.word in {".", ","} for s in joined for w in s.words)
    assert any(w.word.endswith(".") for s in joined for w in s.words)
    assert len([w for s in apart for w in s.words]) == len([w for s in joined for w in s.words]) + len(marks)


def test_words_agree_with_faster_whisper_on_a_clip(tiny_en_pair, librivox):
    pytest.importorskip("faster_whisper")  # the `bench` extra
    from benchmarks import words as bench

    audio = long_recording(librivox[0].path.parent, repeats=1).samples[: 20 * SR]
    fw = bench.faster_whisper(bench.fw_dir("tiny.en"), audio, "en")
    ours = bench.ours(
        tiny_en_pair, TranscribeOptions(word_timestamps=True).with_decode(mode="autoregressive"), audio
    )
    r = bench.compare(ours, fw)
    assert r["matched"] >= 0.9 * max(len(ours), len(fw))
    assert r["mean"] <= bench.MEAN_LIMIT and r["p90"] <= bench.P90_LIMIT, r


# ---- the command line -------------------------------------------------------------------------
def test_cli_layout_options_need_word_timestamps(librivox):
    from click.testing import CliRunner

    from specasr.cli import main

    clip = str(librivox[0].path)
    for args, message in [
        (["--highlight-words"], "need --word-timestamps"),
        (["--max-line-width", "20"], "need --word-timestamps"),
        (["--word-timestamps", "--max-line-count", "2"], "--max-line-count needs --max-line-width"),
    ]:
        result = CliRunner().invoke(main, ["transcribe", clip, "--format", "srt", *args])
        assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.slow  # loads tiny.en
def test_cli_writes_word_subtitles(librivox):
    from click.testing import CliRunner

    from specasr.cli import main

    args = ["transcribe", str(librivox[0].path), "--model", "tiny.en", "--mode", "autoregressive"]
    layout = ["--word-timestamps", "--format", "srt", "--max-line-width", "20", "--max-line-count", "1"]
    result = CliRunner().invoke(main, args + layout)
    assert result.exit_code == 0, result.output
    cues = [block.split("\n") for block in result.stdout.strip().split("\n\n")]
    assert len(cues) >= 4  # a 7 s sentence in lines of at most 20 characters
    ends = 0.0
    for cue in cues:
        start, end = cue[1].split(" --> ")
        assert len(cue) == 3 and (len(cue[2]) <= 20 or " " not in cue[2]), cue
        assert ends <= _srt_seconds(start) <= _srt_seconds(end)
        ends = _srt_seconds(end)
    spoken = " ".join(cue[2] for cue in cues).lower()
    assert "dashwood" in spoken and "leisure" in spoken


def _srt_seconds(clock: str) -> float:
    h, m, rest = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + float(rest.replace(",", "."))
