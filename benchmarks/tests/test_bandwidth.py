"""benchmarks/bandwidth.py: the bytes it charges a decoder pass are the model's own, and the
STREAM-like probe reports what it moved."""

from __future__ import annotations

import pytest

from benchmarks.bandwidth import step_bytes, stream_probe


def test_step_bytes_are_the_decoder_layers_head_and_cross_kv(tiny_en_pair):
    model = tiny_en_pair.target
    cfg = model.config
    layers = model.model.decoder.layers
    # what the pass reads of each layer: all its tensors but the cross-attention k and v
    # projections, whose output is the window's cached K/V
    own = sum(  # state_dict: a packed matrix (`PackedLinear`) saves its dense weight
        t.numel()
        for name, t in layers.state_dict().items()
        if not any(skip in name for skip in ("encoder_attn.k_proj", "encoder_attn.v_proj"))
    )
    parts = step_bytes(cfg, frames=1500)
    assert parts["decoder layers"] == 4 * own
    assert parts["output projection"] == 4 * model.proj_out.weight.numel()
    assert parts["cross-attention K/V"] == 4 * cfg.decoder_layers * 2 * 1500 * cfg.d_model


def test_int8_step_bytes_count_a_byte_per_weight_and_a_scale_per_row(tiny_en_pair):
    model = tiny_en_pair.target
    cfg = model.config
    state = {
        name: t
        for name, t in model.model.decoder.layers.state_dict().items()
        if not any(skip in name for skip in ("encoder_attn.k_proj", "encoder_attn.v_proj"))
    }
    matrices = [t for t in state.values() if t.dim() == 2]
    vectors = [t for t in state.values() if t.dim() == 1]
    want = sum(t.numel() + 4 * t.shape[0] for t in matrices) + 4 * sum(t.numel() for t in vectors)
    parts = step_bytes(cfg, frames=1500, matrix_element=1)
    assert parts["decoder layers"] == want
    assert parts["output projection"] == cfg.vocab_size * (cfg.d_model + 4)
    assert parts["cross-attention K/V"] == step_bytes(cfg, frames=1500)["cross-attention K/V"]


def test_stream_probe_counts_each_kernel_s_bytes(monkeypatch):
    probes = {p.name: p for p in stream_probe(mb=8, repeats=3)}
    assert set(probes) == {"copy", "scale", "add", "triad", "read"}
    assert all(0 < p.median_gbs <= p.best_gbs for p in probes.values())
    # a clock that advances 1 s per call: every kernel then moves its STREAM byte count in 1 s
    ticks = iter(range(10**6))
    monkeypatch.setattr("benchmarks.bandwidth.time.perf_counter", lambda: next(ticks))
    n = int(8e6) // 4
    moved = {p.name: p.best_gbs * 1e9 for p in stream_probe(mb=8, repeats=3)}
    want = {"copy": 8 * n, "scale": 8 * n, "add": 12 * n, "triad": 12 * n, "read": 4 * n}
    assert moved == pytest.approx(want)


def test_fp16_packed_step_bytes_count_two_bytes_per_weight(tiny_en_pair):
    cfg = tiny_en_pair.target.config
    full, half = step_bytes(cfg, frames=1500), step_bytes(cfg, frames=1500, matrix_element=2)
    assert half["output projection"] * 2 == full["output projection"]
    d, f = cfg.d_model, cfg.decoder_ffn_dim
    matrices = cfg.decoder_layers * (6 * d * d + 2 * d * f)
    assert full["decoder layers"] - half["decoder layers"] == 2 * matrices  # vectors stay fp32
    assert half["cross-attention K/V"] == full["cross-attention K/V"]
