"""benchmarks/int8_wer.py: the two int8 pairs it compares, and its three strategies."""

from __future__ import annotations

import os

import torch

from benchmarks.int8_wer import STRATEGIES, _options, _pair


def test_the_two_int8_pairs_differ_in_the_window_products_and_the_switch_comes_back(monkeypatch):
    from specasr.backends.cpu.fused import Int8RowsLinear

    monkeypatch.setenv("SPECASR_FUSED_DRAFT", "1")
    plain = _pair(fp32_window=True)
    assert os.environ["SPECASR_FUSED_DRAFT"] == "1"
    q8 = _pair(fp32_window=False)
    assert plain.compute_type == q8.compute_type == "int8"
    assert not any(isinstance(m, Int8RowsLinear) for m in plain.target.model.encoder.modules())
    assert any(isinstance(m, Int8RowsLinear) for m in q8.target.model.encoder.modules())
    assert isinstance(q8.target.model.decoder.layers[0].encoder_attn.k_proj, Int8RowsLinear)
    assert not isinstance(plain.target.model.decoder.layers[0].encoder_attn.k_proj, Int8RowsLinear)
    mel = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(3))  # [1, 80, 3000]
    with torch.inference_mode():
        a, b = plain.target.model.encoder(mel), q8.target.model.encoder(mel)  # [1, 1500, 512]
    assert not torch.equal(a, b) and (b - a).norm() / a.norm() < 0.1


def test_the_strategies_are_sequential_chunked_and_batched_without_timestamps():
    seq, chunked, batched = (_options(s, "es") for s in STRATEGIES)
    assert seq.strategy == "sequential" and seq.vad is None and seq.decode.language == "es"
    assert chunked.strategy == "chunked" and chunked.batch_size == 8 and chunked.vad is None
    assert chunked.decode.timestamps and not batched.decode.timestamps and batched.vad is not None
    assert {o.decode.mode for o in (seq, chunked, batched)} == {"exact"}
