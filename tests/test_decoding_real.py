"""Decoding with the packaged real models on the LibriVox fixtures."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch
from conftest import with_self_draft

from specasr.decode.loop import decode
from specasr.eval.metric import wer
from specasr.models.convert import cached_conversion
from specasr.models.loading import offline_files
from specasr.options import DecodeOptions
from specasr.transcription import transcribe_clip

AR = DecodeOptions(mode="autoregressive")


def _hf_greedy_text_tokens(pair, mel, language):
    """transformers' generate() on the same converted checkpoint: the reference implementation."""
    from transformers import WhisperForConditionalGeneration

    preset = "base" if pair.tokenizer.multilingual else "tiny.en"
    ref = _REFERENCE.get(preset)
    if ref is None:
        ref = _REFERENCE[preset] = WhisperForConditionalGeneration.from_pretrained(
            cached_conversion(offline_files(preset))
        ).eval()
    kwargs = {"language": language, "task": "transcribe"} if language else {}
    with torch.inference_mode():
        out = ref.generate(input_features=mel, do_sample=False, **kwargs)
    return [t for t in out[0].tolist() if t < pair.tokenizer.eot]


_REFERENCE: dict = {}


def test_greedy_matches_transformers_generate_base(base_pair, librivox, librivox_mels, base_ar):
    for clip in librivox:
        ours = base_ar[clip.id].tokens
        assert ours == _hf_greedy_text_tokens(base_pair, librivox_mels[clip.id], "en"), clip.id


def test_greedy_matches_transformers_generate_tiny_en(tiny_en_pair, librivox, librivox_mels):
    for clip in librivox:
        ours = decode(tiny_en_pair, librivox_mels[clip.id], AR)[0]
        assert ours.tokens == _hf_greedy_text_tokens(tiny_en_pair, librivox_mels[clip.id], None), clip.id
        assert ours.text.strip()


def test_base_wer_on_librivox(librivox, base_ar):
    hyps = [base_ar[c.id].text for c in librivox]
    score = wer([c.text for c in librivox], hyps)
    print(f"base greedy WER on {len(librivox)} LibriVox clips: {score:.3%}")
    assert score <= 0.10, hyps


def test_result_fields(base_ar, librivox):
    r = base_ar[librivox[0].id]
    assert -1.0 < r.avg_logprob < 0.0
    assert 0.0 <= r.no_speech_prob < 0.2  # clear speech
    assert r.stats.encoder_s > 0 and r.stats.decoder_s > 0
    assert r.stats.target_calls == len(r.tokens) + 1  # one pass per token, plus <|endoftext|>


@pytest.mark.parametrize("k", [1, 2, 3])
def test_speculative_greedy_is_exact_with_self_drafts(base_pair, librivox, librivox_mels, base_ar, k):
    pair = with_self_draft(base_pair, k)
    opts = DecodeOptions(mode="baseline")
    for clip in librivox:
        spec = decode(pair, librivox_mels[clip.id], opts)[0]
        assert spec.tokens == base_ar[clip.id].tokens, (k, clip.id)
        assert spec.stats.draft_calls > 0 and spec.stats.proposed > 0
        assert spec.stats.target_calls <= len(spec.tokens) + 1  # every pass emits >= 1 token
        np.testing.assert_allclose(spec.avg_logprob, base_ar[clip.id].avg_logprob, atol=1e-3)


@pytest.mark.parametrize("rate", [8000, 44100, 48000])
def test_resampled_stereo_inputs_transcribe(base_pair, librivox, tmp_path, rate):
    clip = librivox[0]
    audio, sr = sf.read(clip.path, dtype="float32")
    resampled = soxr.resample(audio, sr, rate)
    stereo = np.stack([resampled, 0.8 * resampled], axis=1)
    path = tmp_path / f"{rate}.wav"
    sf.write(path, stereo, rate)
    result = transcribe_clip(path, base_pair, AR)
    score = wer([clip.text], [result.text])
    assert score <= (0.15 if rate == 8000 else 0.10), result.text
