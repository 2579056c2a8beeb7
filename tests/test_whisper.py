"""specasr's own Whisper modules against transformers, the reference implementation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from hf_oracle import hf_config, hf_twin
from tiny_pairs import random_tiny_pair

from specasr.backends.cpu.linear import MappedLinear, PackedLinear, packed_available
from specasr.decode.loop import decode
from specasr.models.convert import cached_conversion
from specasr.models.loading import load_pair, offline_files
from specasr.models.whisper import (
    TRANSPOSED_FILE,
    from_tensors,
    load_whisper,
    read_safetensors,
    use_half_weights,
)
from specasr.options import DecodeOptions


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    """A random tiny Whisper saved by transformers' save_pretrained, with a real tokenizer:
    what a local Hugging Face directory (or a hub snapshot) looks like."""
    from transformers import WhisperForConditionalGeneration

    pair = random_tiny_pair(seed=11)
    cfg = hf_config(pair.target.config, pair.tokenizer)
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(cfg).eval()
    model.generation_config = hf_twin(pair.target, pair.tokenizer).generation_config
    out = tmp_path_factory.mktemp("hf-tiny")
    model.save_pretrained(out)
    (out / "tokenizer.json").write_bytes(offline_files("base").tokenizer.read_bytes())
    return out, model


def _mel(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 80, 3000, generator=torch.Generator().manual_seed(5))  # [B, 80, 3000]


def test_local_hf_directory_loads_and_matches_transformers(saved_tiny):
    path, ref = saved_tiny
    pair = load_pair(str(path), draft=None, device="cpu")
    assert type(pair.target).__module__ == "specasr.models.whisper"
    mel = _mel()
    with torch.inference_mode():
        ours = pair.target.model.encoder(mel)  # [2, 1500, 64]
        theirs = ref.model.encoder(mel).last_hidden_state
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    # greedy tokens equal transformers' generate (the lean CPU decoder and the eager one alike)
    opts = DecodeOptions(
        mode="autoregressive", max_new_tokens=12, suppress_tokens=False, suppress_blank=False
    )
    tokens = [r.tokens for r in decode(pair, mel, opts)]
    with torch.inference_mode():
        out = ref.generate(
            input_features=mel,
            do_sample=False,
            max_new_tokens=12,
            language="en",
            task="transcribe",
            suppress_tokens=None,
            begin_suppress_tokens=None,
        )
    eot = pair.tokenizer.eot
    expected = [[t for t in row.tolist() if t < eot][: len(ours_row)] for row, ours_row in zip(out, tokens)]
    assert tokens == expected and all(len(row) == 12 for row in tokens)


@pytest.mark.slow  # real weights
def test_encoder_states_of_base_match_transformers():
    """Real weights: encoder states within 1e-4 relative of transformers' on the same mel."""
    from transformers import WhisperForConditionalGeneration

    directory = cached_conversion(offline_files("base"))
    ours = load_whisper(directory, torch.float32, torch.device("cpu"))
    ref = WhisperForConditionalGeneration.from_pretrained(directory).eval()
    mel = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(2)) * 0.5
    with torch.inference_mode():
        a = ours.model.encoder(mel)
        b = ref.model.encoder(mel).last_hidden_state
    rel = (a - b).norm() / b.norm()
    assert rel < 1e-4, float(rel)


def test_the_encoder_in_place_is_bitwise_the_autograd_encoder_and_leaves_its_input():
    """Without autograd the encoder scales, activates and sums its own fresh tensors in place;
    with autograd it must not (backward needs them). Both give the same bits, and neither
    touches the caller's mel or a layer's input."""
    encoder = random_tiny_pair(seed=3).target.encoder
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(4))
    kept = mel.clone()
    with torch.inference_mode():
        fast = encoder(mel)
        x = torch.randn(2, 1500, encoder.layers[0].fc2.out_features)
        x_kept = x.clone()
        encoder.layers[0](x)
    assert torch.equal(mel, kept) and torch.equal(x, x_kept)
    encoder.requires_grad_(True)
    try:
        with torch.enable_grad():
            slow = encoder(mel)
            slow.square().sum().backward()  # no tensor that backward needs was overwritten
        assert encoder.layers[0].fc1.weight.grad is not None
    finally:
        encoder.requires_grad_(False).zero_grad(set_to_none=True)
    assert torch.equal(fast, slow.detach())


def test_the_encoder_layers_see_a_row_major_residual_stream():
    """The conv output is channels-first in memory; once the positions are added, every layer
    must get x as plain [B, S, d] rows. Strided x would be copied by each layer norm and by
    the residual sums (13 copies of [B, 1500, d] per base pass)."""
    encoder = random_tiny_pair(seed=3).target.encoder
    seen = []
    hooks = [
        layer.register_forward_pre_hook(lambda _m, args: seen.append(args[0].is_contiguous()))
        for layer in encoder.layers
    ]
    try:
        with torch.inference_mode():
            encoder(_mel())
    finally:
        for h in hooks:
            h.remove()
    assert seen == [True] * len(encoder.layers)


@pytest.mark.slow  # real weights
def test_transposed_cache_holds_the_same_weights():
    directory = cached_conversion(offline_files("tiny.en"))
    side = read_safetensors(directory / TRANSPOSED_FILE)
    main = read_safetensors(directory / "model.safetensors", skip=set())
    assert side and all(torch.equal(wt.t(), main[k]) for k, wt in side.items())
    assert not any("embed_tokens" in k or k.startswith("model.encoder.") for k in side)
    model = load_whisper(directory, torch.float32, torch.device("cpu"))
    layer = model.model.decoder.layers[0]
    cross_k = layer.encoder_attn.k_proj  # runs once per window, over 1500 frames: read from the file
    assert isinstance(cross_k, MappedLinear)
    assert torch.equal(cross_k.weight, main["model.decoder.layers.0.encoder_attn.k_proj.weight"])
    q = layer.self_attn.q_proj  # the step's matrices: packed once, the dense copy freed
    if packed_available():
        assert isinstance(q, PackedLinear) and not list(q.parameters())[1:]  # a bias, no weight
    assert torch.equal(q.weight, main["model.decoder.layers.0.self_attn.q_proj.weight"])


@pytest.mark.slow  # real weights
def test_a_cpu_load_holds_each_weight_once_in_its_run_form():
    """From the conversion cache on CPU: the tied embedding is a map of the file (only
    looked-up rows resident) and the head its oneDNN-packed form; the matrices that run once
    per window (the encoder's, the cross K/V projections) stay maps of the file. Values are
    unchanged: lookups, encoder outputs and cross K/V are bitwise the fp32 model's, the head's
    products equal F.linear up to summation order. `use_half_weights` then adds fbgemm
    fp16-packed forms of the decoder's matrices and the head."""
    from specasr.backends.cpu.linear import (
        HalfPackedHead,
        HalfPackedLinear,
        PackedHead,
        half_available,
    )
    from specasr.models import mapped

    directory = cached_conversion(offline_files("tiny.en"))
    main = read_safetensors(directory / "model.safetensors")
    model = load_whisper(directory, torch.float32, torch.device("cpu"))
    embed = model.model.decoder.embed_tokens.weight
    assert embed.data_ptr() in mapped._MAPS and torch.equal(embed, main["model.decoder.embed_tokens.weight"])
    assert isinstance(model.proj_out, PackedHead) and model.proj_out.weight is embed
    assert model.model.decoder.head is model.proj_out
    x = torch.randn(3, 5, embed.shape[1], generator=torch.Generator().manual_seed(0))
    for rows in (x[:1, :1], x[:1], x):  # one row (a target step), a verify pass, a batch (15 rows)
        torch.testing.assert_close(
            model.proj_out(rows), torch.nn.functional.linear(rows, embed), rtol=1e-5, atol=1e-4
        )
    assert mapped.release(embed) and torch.equal(embed[:7], main["model.decoder.embed_tokens.weight"][:7])
    if half_available():  # the fp16-packed forms a long-lived process adds: the same products
        assert use_half_weights(model)
        fc1 = model.model.decoder.layers[0].fc1
        assert isinstance(fc1.few, HalfPackedLinear) and torch.equal(fc1.few.weight, fc1.weight)
        assert isinstance(model.proj_out, HalfPackedHead) and model.proj_out.weight is embed
        for rows in (x[:1, :1], x[:1], x):  # fp16 blocks, then (15 rows) the rebuilt fp32 blocks
            torch.testing.assert_close(
                model.proj_out(rows), torch.nn.functional.linear(rows, embed), rtol=1e-5, atol=1e-4
            )
        assert isinstance(model.proj_out.wide, PackedHead)

    # the matrices that run once per window stay in the file; a pass leaves none of them resident
    linears = [m for m in model.model.encoder.modules() if isinstance(m, MappedLinear)]
    assert len(linears) == 6 * model.config.encoder_layers
    layers = model.model.decoder.layers
    cross = [getattr(layer.encoder_attn, n) for layer in layers for n in ("k_proj", "v_proj")]
    assert all(isinstance(m, MappedLinear) for m in cross)
    assert all(m.mapped.data_ptr() in mapped._MAPS for m in linears + cross)
    assert not any(p.numel() > 1 << 16 for m in linears for p in m.parameters())  # biases only
    reference = from_tensors(model.config, main)  # the plain fp32 modules, no run forms
    assert not any(isinstance(m, MappedLinear) for m in reference.modules())
    mine, theirs = model.model.encoder.state_dict(), reference.model.encoder.state_dict()
    assert mine.keys() == theirs.keys()
    assert torch.equal(mine["layers.0.fc1.weight"], theirs["layers.0.fc1.weight"])
    mel = torch.randn(1, model.config.num_mel_bins, 3000, generator=torch.Generator().manual_seed(1))
    states = torch.randn(1, 1500, model.config.d_model, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        assert torch.equal(model.model.encoder(mel), reference.model.encoder(mel))
        for mine, theirs in zip(model.model.decoder.layers, reference.model.decoder.layers):
            assert all(torch.equal(a, b) for a, b in zip(mine.cross_kv(states), theirs.cross_kv(states)))


def test_a_checkpoint_that_does_not_fit_is_refused(saved_tiny, tmp_path):
    path, _ = saved_tiny
    for name in ("config.json", "tokenizer.json", "generation_config.json"):
        (tmp_path / name).write_bytes((path / name).read_bytes())
    cfg = json.loads((path / "config.json").read_text())
    cfg["decoder_layers"] += 1
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="missing"):
        load_pair(str(tmp_path), draft=None)


def test_importing_the_pipeline_does_not_import_transformers():
    probe = (
        "import sys\n"
        "import specasr.transcription, specasr.cli, specasr.models.loading\n"
        "print('transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow  # real weights
def test_loading_the_packaged_model_does_not_import_transformers():
    probe = (
        "import sys, specasr\n"
        "from specasr.models.convert import cached_conversion\n"
        "from specasr.models.loading import offline_files\n"
        "cached_conversion(offline_files('tiny.en'))\n"  # converted by another test or here
        "sys.modules.pop('transformers', None)\n"
        "import builtins\n"
        "real = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    if name.startswith('transformers'): raise AssertionError('transformers imported')\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        "pair = specasr.load_pair('tiny.en', draft=None)\n"
        "print(type(pair.target).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "Whisper"
