"""Whisper's search (decode/beam.py): beam search equals transformers' generate(num_beams=…),
speculative beams equal target-only beams, and best-of keeps the best-ranked sample."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import with_self_draft
from hf_oracle import hf_twin
from tiny_pairs import random_tiny_pair

from specasr.decode.beam import Window, penalty, ranked_best
from specasr.decode.loop import decode
from specasr.decode.runners import make_runner
from specasr.features import log_mel_window
from specasr.options import DecodeOptions, TranscribeOptions
from specasr.transcription import transcribe

EOT = 50257
# transformers' beam search is Whisper's when the filtered rows are renormalised (Whisper
# filters logits, then takes log-probs), it stops at num_beams ends (patience 1) and ranks by
# the plain sum (length_penalty 0: ((5 + n) / 6) ** 0 = 1 here, n ** 0 there)
HF_BEAMS = {"length_penalty": 0.0, "early_stopping": True, "renormalize_logits": True}


@pytest.fixture(scope="module")
def tiny():
    return random_tiny_pair(seed=3)


def _mel(rows: int, seed: int = 5) -> torch.Tensor:
    return torch.randn(rows, 80, 3000, generator=torch.Generator().manual_seed(seed))  # [B, 80, 3000]


def _hf_beams(pair, mel: torch.Tensor, beams: int, preset: str | None = None, **kwargs) -> list[list[int]]:
    """transformers' beam search on the same weights (a packaged preset's converted checkpoint,
    or the random pair's twin): each row's text tokens."""
    twin = _reference(preset) if preset else hf_twin(pair.target, pair.tokenizer)
    lang = {"language": "en", "task": "transcribe"} if pair.tokenizer.multilingual else {}
    with torch.inference_mode():
        out = twin.generate(
            input_features=mel, do_sample=False, num_beams=beams, **lang, **HF_BEAMS, **kwargs
        )
    return [[t for t in row.tolist() if t < pair.tokenizer.eot] for row in out]


_REFERENCE: dict = {}


def _reference(preset: str):
    from transformers import WhisperForConditionalGeneration

    from specasr.models.convert import cached_conversion
    from specasr.models.loading import offline_files

    if preset not in _REFERENCE:
        path = cached_conversion(offline_files(preset))
        _REFERENCE[preset] = WhisperForConditionalGeneration.from_pretrained(path).eval()
    return _REFERENCE[preset]


# --- the search's rules, on hand-made offers ------------------------------------------


def test_an_end_ranked_below_the_beam_width_is_not_a_hypothesis():
    """Offers ranked x, eot, eot, y with two beams: the first end finishes, the second (rank 2)
    does not (openai-whisper would keep it and could stop on it), and x, y go on."""
    w = Window([[1, 2]], [0.0])
    w.advance([[(-0.1, 10), (-0.2, EOT), (-0.3, EOT), (-0.4, 11)]], beam_size=2, most=2, eot=EOT)
    assert w.beams == [[1, 2, 10], [1, 2, 11]] and w.scores == [-0.1, -0.4]
    assert w.finished == {(1, 2): -0.2} and not w.done


def test_patience_lets_more_hypotheses_finish_before_the_search_ends():
    offers = [[(-0.1, EOT), (-0.2, 10), (-0.3, 11)], [(-0.15, EOT), (-0.25, 12), (-0.35, 13)]]
    for most, done in ((2, True), (3, False)):
        w = Window([[1, 2], [1, 3]], [0.0, -1.0])
        w.advance(offers, beam_size=2, most=most, eot=EOT)
        # ranked: (1,2)+eot -0.1, (1,2)+10 -0.2, (1,2)+11 -0.3, (1,3)+eot -1.15 (rank 3: dropped)
        assert w.finished == {(1, 2): -0.1} and w.done is False
        w.advance(
            [[(-0.5, EOT), (-0.6, 14), (-0.7, 15)], [(-0.1, EOT), (-0.2, 16), (-0.3, 17)]], 2, most, EOT
        )
        assert w.done is done and len(w.finished) == 2


def test_at_the_limit_running_beams_finish_in_rank_order():
    w = Window([[1, 5], [1, 6], [1, 7]], [-3.0, -1.0, -2.0], finished={(1, 4): -0.5})
    w.finalize(beam_size=3)
    assert w.done and list(w.finished) == [(1, 4), (1, 6), (1, 7)]


def test_the_length_penalty_decides_between_short_and_long():
    lengths, sums = [4, 10], [-2.0, -4.0]
    assert ranked_best(lengths, sums, None) == 1  # -0.5 against -0.4 per token
    assert ranked_best(lengths, sums, 0.0) == 0  # the plain sum
    assert penalty(10, 1.0) == pytest.approx(2.5) and penalty(0, None) == 1


def test_reorder_gathers_each_rows_cache_from_its_source(tiny):
    """Rows may repeat and swap: every row's cache and length afterwards is its source's."""
    states = torch.randn(3, 1500, 64, generator=torch.Generator().manual_seed(1))
    states = states[:1].expand(3, -1, -1).contiguous()  # one window's beams: the same frames
    with torch.inference_mode():
        runner = make_runner(tiny.target, states)
        tokens = torch.randint(0, 50000, (3, 5), generator=torch.Generator().manual_seed(2))
        runner(tokens, 1)
        runner.rollback([5, 3, 4])
        before = [[t.clone() for t in runner.cache_prefix(r)] for r in range(3)]  # (views, moved next)
        runner.reorder([2, 2, 0])
        assert runner.lengths == [4, 4, 5]
        for row, src in enumerate([2, 2, 0]):
            for a, b in zip(runner.cache_prefix(row), before[src]):
                assert torch.equal(a, b)


# --- beam search against transformers; speculative beams against target-only ----------


@pytest.mark.parametrize("beams", [2, 4])
def test_beam_search_equals_transformers_generate(tiny, beams):
    mel = _mel(2)
    opts = DecodeOptions(
        mode="autoregressive",
        beam_size=beams,
        length_penalty=0.0,
        max_new_tokens=10,
        suppress_tokens=False,
        suppress_blank=False,
    )
    ours = [r.tokens for r in decode(tiny, mel, opts)]
    assert ours == _hf_beams(
        tiny, mel, beams, max_new_tokens=10, suppress_tokens=None, begin_suppress_tokens=None
    )
    assert all(len(row) == 10 for row in ours)


@pytest.mark.parametrize(("mode", "draft"), [("exact", "random"), ("baseline", "the target itself")])
def test_speculative_beams_equal_target_only_beams(tiny, mode, draft):
    """With timestamps and a prompt, on two windows at once: a draft that rarely agrees and
    one that always proposes each beam's greedy path give target-only beam search's tokens, and
    the agreeing one in fewer target passes."""
    pair = tiny if draft == "random" else with_self_draft(tiny, 2)
    mel = _mel(2, seed=8)
    prompt = pair.tokenizer.encode(" the quick brown fox")
    base = DecodeOptions(
        beam_size=3, timestamps=True, max_new_tokens=12, gamma=4, gamma_policy="fixed", speculative_beams=True
    )
    ar = decode(pair, mel, replace(base, mode="autoregressive"), prompt=prompt)
    spec = decode(pair, mel, replace(base, mode=mode), prompt=prompt)
    assert [r.tokens for r in spec] == [r.tokens for r in ar]
    assert [r.avg_logprob for r in spec] == pytest.approx([r.avg_logprob for r in ar], abs=1e-4)
    if draft != "random":  # (a beam that forks off its parent's proposal ends the replay)
        assert spec[0].stats.accepted > 0 and spec[0].stats.target_calls < ar[0].stats.target_calls
    # by default a CPU's beams are the target's alone: the same tokens, no draft pass
    auto = decode(pair, mel, replace(base, mode=mode, speculative_beams=None), prompt=prompt)
    assert [r.tokens for r in auto] == [r.tokens for r in ar] and auto[0].stats.draft_calls == 0


def test_a_batch_of_windows_searches_as_each_window_alone(tiny):
    mel = _mel(2, seed=9)
    opts = DecodeOptions(mode="autoregressive", beam_size=3, max_new_tokens=6)
    together = [r.tokens for r in decode(tiny, mel, opts)]
    assert together == [decode(tiny, mel[i : i + 1], opts)[0].tokens for i in range(2)]


# --- best-of ----------------------------------------------------------------------------


def test_best_of_keeps_the_best_ranked_of_the_samples(tiny):
    """best_of=3 at T = 0.8 returns, per window, the sample with the highest log-prob per
    token among that window's three rows of the same decode; speculation returns the same."""
    mel = _mel(2, seed=4)
    opts = DecodeOptions(mode="autoregressive", temperature=0.8, best_of=3, max_new_tokens=6, seed=7)
    rows = decode(tiny, mel.repeat_interleave(3, dim=0), replace(opts, best_of=1))
    expected = []
    for k in range(2):
        mine = rows[3 * k : 3 * k + 3]  # a sum counts eot's log-prob, a length does not
        best = ranked_best(
            [len(r.tokens) for r in mine], [r.avg_logprob * (len(r.tokens) + 1) for r in mine], None
        )
        expected.append(mine[best].tokens)
    assert len({tuple(r.tokens) for r in rows}) > 2  # the samples differ
    assert [r.tokens for r in decode(tiny, mel, opts)] == expected
    assert [r.tokens for r in decode(tiny, mel, replace(opts, mode="exact"))] == expected


# --- real weights -------------------------------------------------------------------------


def _noisy_mels(librivox, clips: int, noise: float) -> list[torch.Tensor]:
    rng = np.random.default_rng(0)
    mels = []
    for c in librivox[:clips]:
        audio = sf.read(str(c.path), dtype="float32")[0]
        audio = audio + noise * rng.standard_normal(len(audio)).astype("float32")
        mels.append(log_mel_window(audio, n_mels=80))
    return mels


def test_tiny_en_beams_equal_transformers_and_differ_from_greedy(tiny_en_pair, librivox, librivox_mels):
    opts = DecodeOptions(mode="autoregressive", beam_size=5, length_penalty=0.0)
    differ = 0
    for clip in librivox:
        mel = librivox_mels[clip.id]
        ours = decode(tiny_en_pair, mel, opts)[0].tokens
        assert ours == _hf_beams(tiny_en_pair, mel, 5, "tiny.en")[0], clip.id
        differ += ours != decode(tiny_en_pair, mel, replace(opts, beam_size=1))[0].tokens
    assert differ >= 2  # the search is not greedy decoding (two of the five clips)


@pytest.mark.slow  # loads base and its packaged draft
def test_speculative_beams_with_the_packaged_draft_equal_beam_search(base_shipped, librivox):
    """Noisy speech, where base's beams leave its greedy path: the packaged reduced-vocabulary
    draft's speculative beams give target-only beam search's tokens, in fewer target passes."""
    pair = base_shipped
    opts = DecodeOptions(
        mode="autoregressive",
        beam_size=5,
        length_penalty=0.0,
        gamma=4,
        gamma_policy="fixed",
        speculative_beams=True,
    )
    passes = {"autoregressive": 0, "exact": 0}
    differ = 0
    for mel in _noisy_mels(librivox, 1, noise=0.08):
        ar = decode(pair, mel, opts)[0]
        spec = decode(pair, mel, replace(opts, mode="exact"))[0]
        assert spec.tokens == ar.tokens
        passes["autoregressive"] += ar.stats.target_calls
        passes["exact"] += spec.stats.target_calls
        differ += ar.tokens != decode(pair, mel, replace(opts, beam_size=1))[0].tokens
    assert differ >= 1 and passes["exact"] < passes["autoregressive"]


def test_long_form_beams_in_every_mode(tiny_en_pair, librivox):
    """Through `transcribe` (sequential, timestamps, prompts from the text before): beam search
    at T = 0; with the target as its own draft, exact gives autoregressive's segments."""
    audio = np.concatenate([sf.read(str(c.path), dtype="float32")[0] for c in (librivox[1], librivox[3])])
    pair = with_self_draft(tiny_en_pair, 4)
    base = TranscribeOptions().with_decode(beam_size=5, language="en", speculative_beams=True)
    texts = {}
    for mode in ("autoregressive", "exact"):
        segments, _ = transcribe(audio, pair, base.with_decode(mode=mode), source_rate=16000)
        texts[mode] = [(s.start, s.end, s.text) for s in segments]
    assert texts["exact"] == texts["autoregressive"] and len(texts["exact"]) >= 2
    greedy, _ = transcribe(
        audio, pair, base.with_decode(mode="autoregressive", beam_size=1), source_rate=16000
    )
    assert [s.text for s in greedy] != [t for _, _, t in texts["exact"]]
