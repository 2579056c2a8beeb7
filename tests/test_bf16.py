"""bf16 encoder products (`compute_type="bfloat16"` / `"int8_bfloat16"`, `specasr.backends.cpu.bf16`):
close to fp32, refused where the CPU has no native bf16, and exact speculative decoding
against the bf16 target. Machines without native bf16 run the same code emulated (slower),
so the loader is told bf16 is available where a test needs it."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from tiny_pairs import random_tiny_pair
from torch import nn

from specasr.backends.cpu import bf16
from specasr.backends.cpu.bf16 import Bf16Attention, Bf16Linear, Bf16Norm, bf16_cross_kv, bf16_encoder
from specasr.backends.cpu.linear import int8_available
from specasr.models.loading import resolve_compute_type


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_a_bf16_product_is_close_to_fp32_adds_its_bias_and_returns_the_asked_dtype():
    torch.manual_seed(0)
    linear = nn.Linear(64, 96)
    x = torch.randn(5, 64)
    want = linear(x).detach()
    fp32_out, bf16_out = Bf16Linear.of(linear), Bf16Linear.of(linear, torch.bfloat16)
    y, z = fp32_out(x), bf16_out(x.bfloat16())
    assert y.dtype == torch.float32 and z.dtype == torch.bfloat16
    assert _rel(y, want) < 1e-2 and _rel(z, want) < 2e-2
    assert fp32_out.weight.dtype == torch.bfloat16 and fp32_out.bias.dtype == torch.float32
    no_bias = Bf16Linear.of(nn.Linear(64, 96, bias=False))
    assert no_bias(x).dtype == torch.float32
    shifted = copy.deepcopy(linear)
    shifted.bias.data += 1.0
    assert _rel(Bf16Linear.of(shifted)(x) - 1.0, y) < 1e-5  # the bias is added, in fp32


def test_a_bf16_encoder_keeps_an_fp32_stream_and_stays_close_to_fp32():
    """Every layer's products become bf16 (fc1 hands GELU and fc2 bf16 rows), the norms feed
    bf16 rows, the stream between layers stays fp32, and the states move by bf16's rounding
    only. Converting twice changes nothing."""
    encoder = random_tiny_pair(seed=3).target.encoder
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        want = encoder(mel)
        fast = bf16_encoder(copy.deepcopy(encoder))
        seen = []
        hooks = [
            layer.register_forward_pre_hook(lambda _m, a: seen.append(a[0].dtype)) for layer in fast.layers
        ]
        got = fast(mel)
        for h in hooks:
            h.remove()
        again = bf16_encoder(fast)(mel)
    layer = fast.layers[0]
    assert isinstance(layer.fc1, Bf16Linear) and layer.fc1.out == torch.bfloat16
    assert isinstance(layer.self_attn.k_proj, Bf16Linear) and isinstance(layer.final_layer_norm, Bf16Norm)
    assert seen == [torch.float32] * len(fast.layers) and got.dtype == torch.float32
    assert 0 < _rel(got, want) < 3e-2
    assert torch.equal(again, got)


def _attention_or_skip(heads: int) -> Bf16Attention:
    attention = Bf16Attention.of(heads, 64 * heads)
    if attention is None:  # a CPU without AVX512_BF16, or no C++ compiler: the layers keep torch's
        pytest.skip("the compiled library has no AVX512_BF16 attention on this machine")
    return attention


def _sdpa(q, k, v, heads: int) -> torch.Tensor:
    """torch's fp32 attention over [B, S, d] (q scaled), the heads merged."""
    split = lambda t: t.float().view(*t.shape[:2], heads, -1).transpose(1, 2)  # noqa: E731
    y = torch.nn.functional.scaled_dot_product_attention(split(q), split(k), split(v), scale=1.0)
    return y.transpose(1, 2).reshape(q.shape)


@pytest.mark.parametrize(("windows", "frames", "heads"), [(2, 1500, 8), (1, 37, 6), (1, 1500, 20)])
def test_the_library_attention_is_a_bf16_attention_and_each_windows_own(windows, frames, heads):
    """`Bf16Attention` (attend_bf16 in draft_step.cpp): within bf16's rounding of torch's fp32
    attention (as close as torch's own bf16 attention), any frame count (37: not a multiple of
    its 16-key vectors), Whisper's head counts; a window's output is bitwise the one it gets
    alone, and on one thread."""
    attention = _attention_or_skip(heads)
    g = torch.Generator().manual_seed(frames + heads)
    q, k, v = (torch.randn(windows, frames, 64 * heads, generator=g) for _ in range(3))
    q *= 3 * 64**-0.5  # scaled, and sharper than unit scores
    q[0, 1] *= 40.0  # one query attending to one key alone: exp underflows everywhere else
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    with torch.inference_mode():
        got = attention(qb, kb, vb)
        want, rounded = _sdpa(q, k, v, heads), _sdpa(qb, kb, vb, heads)
        assert got.dtype == torch.float32 and got.shape == q.shape and torch.isfinite(got).all()
        assert _rel(got, want) < 1.5 * _rel(rounded, want) + 1e-4 and _rel(got, want) < 1e-2
        alone = attention(qb[-1:], kb[-1:], vb[-1:])
        assert torch.equal(alone, got[-1:])
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            one = attention(qb, kb, vb)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(one, got)


def test_a_bf16_encoder_attends_through_the_library_where_it_runs(monkeypatch):
    """`bf16_encoder` gives layers of 64-wide heads the library's attention and bf16 q, k, v,
    close to the fp32 encoder; with the library off (`SPECASR_FUSED_DRAFT=0`) they keep torch's
    attention over fp32 q, k, v."""
    from specasr.models.whisper import SelfAttention, WhisperDims, WhisperEncoder

    _attention_or_skip(2)
    dims = WhisperDims(100, 80, 128, 2, 1, 2, 2, 256, 256)
    torch.manual_seed(7)
    encoder = WhisperEncoder(dims).eval().requires_grad_(False)
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(8))
    with torch.inference_mode():
        want = encoder(mel)
        fast = bf16_encoder(copy.deepcopy(encoder))
        got = fast(mel)
        monkeypatch.setenv("SPECASR_FUSED_DRAFT", "0")
        plain = bf16_encoder(copy.deepcopy(encoder))
        slow = plain(mel)
    layer, other = fast.layers[0], plain.layers[0]
    assert isinstance(layer.attend, Bf16Attention) and layer.self_attn.q_proj.out == torch.bfloat16
    assert type(other.attend) is SelfAttention and other.self_attn.q_proj.out == torch.float32
    assert 0 < _rel(got, want) < 3e-2 and 0 < _rel(slow, want) < 3e-2
    from specasr.models.loading import encoder_form  # what `specasr models --explain` says

    assert "bf16 attention" in encoder_form(fast) and "fp32 attention" in encoder_form(plain)


def test_bf16_cross_kv_projections_give_fp32_k_v_close_to_fp32():
    """The decoder's cross K/V projections (once per window) become bf16 products; the K/V
    every step reads stay fp32 [B, H, S, dh], within bf16's rounding of the fp32 ones."""
    decoder = random_tiny_pair(seed=5).target.model.decoder
    states = torch.randn(2, 1500, decoder.d_model, generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        want = [layer.cross_kv(states) for layer in decoder.layers]
        got = [layer.cross_kv(states) for layer in bf16_cross_kv(copy.deepcopy(decoder)).layers]
    for (wk, wv), (gk, gv) in zip(want, got):
        assert gk.dtype == torch.float32 and gk.shape == wk.shape and gk.is_contiguous()
        assert 0 < _rel(gk, wk) < 1e-2 and 0 < _rel(gv, wv) < 1e-2


def test_bf16_compute_types_need_native_bf16_on_a_cpu_in_fp32(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(bf16, "available", lambda: False)
    for ct in ("bfloat16", "int8_bfloat16"):
        with pytest.raises(ValueError, match="native bf16 dot products"):
            resolve_compute_type(ct, cpu, torch.float32)
    monkeypatch.setattr(bf16, "available", lambda: True)
    assert resolve_compute_type("bfloat16", cpu, torch.float32) == "bfloat16"
    if int8_available():
        assert resolve_compute_type("int8_bfloat16", cpu, torch.float32) == "int8_bfloat16"
    with pytest.raises(ValueError, match="native bf16"):
        resolve_compute_type("bfloat16", cuda, torch.float16)
    assert resolve_compute_type("auto", cpu, torch.float32, speculative=True) == "float32"  # a draft: by name
    if int8_available() and torch.backends.cpu.get_cpu_capability().startswith("AVX"):
        assert resolve_compute_type("auto", cpu, torch.float32) == "int8_bfloat16"  # target only: fastest
        monkeypatch.setattr(bf16, "available", lambda: False)
        assert resolve_compute_type("auto", cpu, torch.float32) == "int8"


def test_the_cli_refuses_a_bf16_compute_type_without_native_bf16_before_loading(tmp_path, monkeypatch):
    """A usage error (exit 2) that names the missing instructions, before any model loads,
    in every command that takes --compute-type."""
    from click.testing import CliRunner

    from specasr.cli import main

    monkeypatch.setattr(bf16, "available", lambda: False)
    wav = tmp_path / "x.wav"
    wav.write_bytes(b"")
    for args in (
        ["transcribe", str(wav), "--compute-type", "bfloat16"],
        ["transcribe", str(wav), "--mode", "autoregressive", "--compute-type", "int8_bfloat16"],
        ["eval", "librispeech-clean", "--data-dir", str(tmp_path), "--compute-type", "bfloat16"],
    ):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and "native bf16" in result.output, args


def test_an_int8_bfloat16_target_speculates_only_with_row_invariant_attention():
    from specasr.decode.loop import speculates_exactly

    tiny = random_tiny_pair(seed=3)
    assert speculates_exactly(replace(tiny, compute_type="bfloat16"))
    assert not speculates_exactly(replace(tiny, compute_type="int8_bfloat16"))  # fp32 layers: no fixed rows


@pytest.mark.slow  # real weights; emulated bf16 where the CPU has none
@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 linear")
def test_an_int8_bfloat16_base_decodes_exactly_against_itself_and_keeps_its_wer(
    librivox, librivox_mels, base_pair, monkeypatch
):
    """base with bf16 encoder products and an int8 decoder, with the packaged draft: exact mode
    gives the target's own autoregressive tokens on every LibriVox clip and on the long-form
    fixture (chunked, VAD, text only), and the fixture's WER stays within half a point of fp32."""
    from benchmarks.longform import long_recording
    from specasr.decode.loop import decode_states
    from specasr.eval.metric import wer
    from specasr.models.loading import load_pair
    from specasr.options import DecodeOptions, TranscribeOptions, VadOptions
    from specasr.transcription import transcribe

    monkeypatch.setattr(bf16, "available", lambda: True)
    pair = load_pair("base", "default", compute_type="int8_bfloat16")
    assert pair.compute_type == "int8_bfloat16"
    assert isinstance(pair.target.model.encoder.layers[0].fc2, Bf16Linear)
    assert isinstance(pair.target.model.decoder.layers[0].encoder_attn.v_proj, Bf16Linear)
    for clip in librivox:
        # one bf16 encode per clip (emulated where the CPU has no bf16: the slow part), read by both decodes
        states = pair.encode(librivox_mels[clip.id])
        ar = decode_states(pair, *states, DecodeOptions(mode="autoregressive"))[0]
        ex = decode_states(pair, *states, DecodeOptions(mode="exact"))[0]
        assert ex.tokens == ar.tokens, clip.id
    rec = long_recording(librivox[0].path.parent)
    opts = TranscribeOptions(strategy="chunked", batch_size=8, vad=VadOptions()).with_decode(timestamps=False)
    texts, tokens = {}, {}
    for name, p in (("bf16", pair), ("fp32", base_pair)):
        for mode in ("autoregressive", "exact") if name == "bf16" else ("autoregressive",):
            segments, info = transcribe(rec.samples, p, opts.with_decode(mode=mode), source_rate=16000)
            segments = list(segments)
            tokens[name, mode] = [s.tokens for s in segments]
            texts[name, mode] = " ".join(s.text for s in segments)
            if mode == "exact":
                assert info.stats.proposed > 0
    assert tokens["bf16", "exact"] == tokens["bf16", "autoregressive"]
    refs = [" ".join(rec.texts)]
    assert wer(refs, [texts["bf16", "exact"]]) <= wer(refs, [texts["fp32", "autoregressive"]]) + 0.005
