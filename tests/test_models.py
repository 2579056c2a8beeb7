"""Model loading: CTranslate2 conversion, the conversion cache, drafts and their checks.

Uses the real packaged weights (presets `base` and `tiny.en`), converted into a
session-private cache so the user's cache is never touched.
"""

from __future__ import annotations

import json
import re
import shutil
import struct

import huggingface_hub.constants
import jiwer
import pytest
import soundfile as sf
import torch
from hf_oracle import hf_twin
from tiny_pairs import random_tiny_pair
from transformers import WhisperFeatureExtractor
from whisper_normalizer.english import EnglishTextNormalizer

import specasr.models.convert
from specasr.decode.loop import decode
from specasr.models.convert import CT2Files, cached_conversion, content_key, convert_ct2
from specasr.models.loading import encoders_equal, list_presets, load_pair, offline_files, self_draft
from specasr.options import DecodeOptions

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("specasr-cache")
        mp.setenv("SPECASR_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def base():
    return load_pair("base", "self:2", device="cpu")  # the default draft is tested in test_packaged_draft


@pytest.fixture(scope="module")
def tiny_hf_dir():
    """The tiny.en CTranslate2 package converted to a Hugging Face dir."""
    return cached_conversion(offline_files("tiny.en"))


def _transcribe(pair, clip) -> str:
    """Greedy text with the converted weights (transformers' own features, specasr's decoder)."""
    audio, sr = sf.read(clip.path, dtype="float32")
    fe = WhisperFeatureExtractor(feature_size=pair.n_mels)
    mel = fe(audio, sampling_rate=sr, return_tensors="pt").input_features  # [1, n_mels, 3000]
    return decode(pair, mel, DecodeOptions(mode="autoregressive"))[0].text


def _wer(ref: str, hyp: str) -> float:
    norm = EnglishTextNormalizer()
    return jiwer.wer(norm(ref), norm(hyp))


@pytest.mark.parametrize("preset, clip_index", [("base", 0), ("tiny.en", 3)])
def test_converted_model_transcribes_librivox(preset, clip_index, base, librivox):
    pair = base if preset == "base" else load_pair(preset, draft=None, device="cpu")
    clip = librivox[clip_index]
    hyp = _transcribe(pair, clip)
    assert _wer(clip.text, hyp) <= 0.2, hyp


def test_base_config_derived_from_tensors(base):
    cfg = base.target.config
    assert (cfg.d_model, cfg.encoder_layers, cfg.decoder_layers) == (512, 6, 6)
    assert (cfg.encoder_attention_heads, cfg.decoder_attention_heads) == (8, 8)
    assert (cfg.encoder_ffn_dim, cfg.num_mel_bins, cfg.vocab_size) == (2048, 80, 51865)
    hf_dir = cached_conversion(offline_files("base"))
    assert (
        json.loads((hf_dir / "config.json").read_text())["decoder_start_token_id"]
        == base.tokenizer.sot
        == 50258
    )
    gen = json.loads((hf_dir / "generation_config.json").read_text())  # as transformers wrote it
    assert gen["no_timestamps_token_id"] == 50363 and gen["is_multilingual"]
    assert gen["lang_to_id"]["<|en|>"] == 50259 and gen["task_to_id"]["transcribe"] == 50359
    assert base.begin_suppress_tokens == (220, 50257) and 50362 in base.suppress_tokens
    assert base.target.generation.alignment_heads  # for word timestamps, from the CTranslate2 config
    assert base.target.proj_out.weight is base.target.model.decoder.embed_tokens.weight


def test_ct2_dir_and_hf_dir_load_identical_weights(tmp_path, tiny_hf_dir):
    ct2 = load_pair(str(offline_files("tiny.en").model_parts[0].parent), draft=None)
    hf_twin(ct2.target, ct2.tokenizer).save_pretrained(tmp_path)  # transformers writes the directory
    shutil.copy(tiny_hf_dir / "tokenizer.json", tmp_path)
    hf = load_pair(str(tmp_path), draft=None)
    a, b = ct2.target.state_dict(), hf.target.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (hf.vocab_size, hf.n_mels, hf.draft) == (51864, 80, None)
    assert not hf.tokenizer.multilingual


def test_draft_with_other_tokenizer_is_refused():
    with pytest.raises(ValueError, match="tokenizer differs"):
        load_pair("base", draft="tiny.en")


def test_self_draft_shares_target_modules(base):
    t, d = base.target, base.draft
    assert base.draft_name == "self:2" and base.shared_encoder
    assert d.config.decoder_layers == 2 and len(d.model.decoder.layers) == 2
    assert d.model.encoder is t.model.encoder
    assert all(d.model.decoder.layers[i] is t.model.decoder.layers[i] for i in range(2))
    assert d.model.decoder.layer_norm is t.model.decoder.layer_norm
    assert d.proj_out.weight is t.model.decoder.embed_tokens.weight
    target_ptrs = {p.data_ptr() for p in t.parameters()}
    assert all(p.data_ptr() in target_ptrs for p in d.parameters())  # no copies
    states, draft_states = base.encode(torch.zeros(1, 80, 3000))
    assert states.shape == (1, 1500, 512) and draft_states is states


def test_self_draft_with_all_layers_is_the_target():
    pair = random_tiny_pair(seed=3)
    full, short = self_draft(pair.target, 2), self_draft(pair.target, 1)
    enc, _ = pair.encode(torch.randn(1, 80, 3000))
    ids = torch.tensor([pair.tokenizer.sot_sequence("en")])
    with torch.inference_mode():
        logits = [m.proj_out(m.model.decoder(ids, enc)) for m in (pair.target, full, short)]
    assert torch.equal(logits[0], logits[1])
    assert not torch.allclose(logits[0], logits[2])
    with pytest.raises(ValueError, match="self:3"):
        self_draft(pair.target, 3)


def test_identical_encoder_loaded_separately_is_shared():
    pair = load_pair("tiny.en", draft="tiny.en")
    assert pair.shared_encoder and pair.draft is not pair.target
    assert pair.draft.model.encoder is pair.target.model.encoder  # deduplicated
    random = random_tiny_pair(seed=0)
    assert not random.shared_encoder
    assert not encoders_equal(random.target.model.encoder, random.draft.model.encoder)
    a, b = random.encode(torch.zeros(2, 80, 3000))
    assert a.shape == b.shape == (2, 1500, 64) and a is not b


def test_conversion_cache_is_reused(tiny_hf_dir, monkeypatch, tmp_path):
    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(specasr.models.convert, "convert_ct2", no_conversion)
    assert cached_conversion(offline_files("tiny.en")) == tiny_hf_dir
    load_pair("tiny.en", draft=None)
    # The key is the content of model.bin, not its file layout: split parts hit the same entry.
    whole = offline_files("tiny.en")
    data = whole.model_parts[0].read_bytes()
    parts = (tmp_path / "p1", tmp_path / "p2")
    parts[0].write_bytes(data[:1000])
    parts[1].write_bytes(data[1000:])
    split = CT2Files(parts, whole.config, whole.tokenizer)
    assert cached_conversion(split) == tiny_hf_dir
    assert content_key(split, tmp_path / "c") == content_key(whole, tmp_path / "c")


def test_hub_id_loads_from_local_hub_cache(tiny_hf_dir, tmp_path, monkeypatch):
    """The real hub code path, served from a hand-made Hugging Face cache in offline mode."""
    commit = "0" * 40
    for repo in ("openai/whisper-small.en", "distil-whisper/distil-small.en"):
        entry = tmp_path / f"models--{repo.replace('/', '--')}"
        (entry / "refs").mkdir(parents=True)
        (entry / "refs" / "main").write_text(commit)
        (entry / "snapshots").mkdir()
        (entry / "snapshots" / commit).symlink_to(tiny_hf_dir, target_is_directory=True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    rows = {r["name"]: r for r in list_presets()}
    assert rows["small.en"]["available_locally"] and not rows["large-v3"]["available_locally"]
    assert rows["base"]["offline"] and rows["base"]["available_locally"]
    pair = load_pair("small.en")  # preset -> hub ids for target and draft
    assert pair.draft_name == "distil-whisper/distil-small.en"
    assert pair.shared_encoder and pair.vocab_size == 51864


def test_random_tiny_pair_uses_real_tokenizer():
    pair = random_tiny_pair(seed=1, draft_layers=1)
    assert pair.vocab_size == pair.draft.config.vocab_size == 51865
    assert pair.tokenizer.multilingual and pair.draft.config.decoder_layers == 1
    assert pair.begin_suppress_tokens == (220, 50257)
    en = random_tiny_pair(tokenizer="tiny.en")
    assert en.vocab_size == 51864 and en.tokenizer.timestamp_begin == 50363


# ---- a CTranslate2 writer for round trips through the converter --------------------------
def _ct2_variables(sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """HF state dict -> CTranslate2 Whisper names, with its fused projections."""
    v: dict[str, torch.Tensor] = {}

    def lin(dst, src):
        v[f"{dst}/weight"], v[f"{dst}/bias"] = sd[f"{src}.weight"], sd[f"{src}.bias"]

    def norm(dst, src):
        v[f"{dst}/gamma"], v[f"{dst}/beta"] = sd[f"{src}.weight"], sd[f"{src}.bias"]

    def attn(dst, src, fused_qkv):
        q, k, vv = (f"{src}.{n}_proj" for n in "qkv")
        zero = torch.zeros_like(sd[f"{q}.bias"])
        ws, bs = [sd[f"{n}.weight"] for n in (q, k, vv)], [sd[f"{q}.bias"], zero, sd[f"{vv}.bias"]]
        if fused_qkv:  # [Q; K; V]
            v[f"{dst}/linear_0/weight"], v[f"{dst}/linear_0/bias"] = torch.cat(ws), torch.cat(bs)
            lin(f"{dst}/linear_1", f"{src}.out_proj")
        else:  # Q, then [K; V]
            lin(f"{dst}/linear_0", q)
            v[f"{dst}/linear_1/weight"] = torch.cat(ws[1:])
            v[f"{dst}/linear_1/bias"] = torch.cat(bs[1:])
            lin(f"{dst}/linear_2", f"{src}.out_proj")

    for stack, n_layers in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        hf = f"model.{stack}"
        v[f"{stack}/num_heads"] = torch.tensor(cfg.encoder_attention_heads, dtype=torch.int16)
        v[f"{stack}/position_encodings/encodings"] = sd[f"{hf}.embed_positions.weight"]
        norm(f"{stack}/layer_norm", f"{hf}.layer_norm")
        for i in range(n_layers):
            dst, src = f"{stack}/layer_{i}", f"{hf}.layers.{i}"
            attn(f"{dst}/self_attention", f"{src}.self_attn", True)
            norm(f"{dst}/self_attention/layer_norm", f"{src}.self_attn_layer_norm")
            if stack == "decoder":
                attn(f"{dst}/attention", f"{src}.encoder_attn", False)
                norm(f"{dst}/attention/layer_norm", f"{src}.encoder_attn_layer_norm")
            norm(f"{dst}/ffn/layer_norm", f"{src}.final_layer_norm")
            lin(f"{dst}/ffn/linear_0", f"{src}.fc1")
            lin(f"{dst}/ffn/linear_1", f"{src}.fc2")
    lin("encoder/conv1", "model.encoder.conv1")
    lin("encoder/conv2", "model.encoder.conv2")
    v["decoder/embeddings/weight"] = sd["model.decoder.embed_tokens.weight"]
    return v


def _write_ct2(path, variables: dict[str, torch.Tensor], int8: bool) -> None:
    if int8:  # per-row int8 of the linear weights, as CTranslate2 stores them
        for name in [n for n in variables if re.search(r"linear_\d/weight$", n)]:
            w = variables[name].float()
            scale = 127.0 / w.abs().amax(dim=1)
            variables[name] = (w * scale[:, None]).round().to(torch.int8)
            variables[name + "_scale"] = scale
    dtype_ids = {torch.float32: 0, torch.int8: 1, torch.int16: 2, torch.float16: 4}

    def string(s):
        return struct.pack("<H", len(s) + 1) + s.encode() + b"\0"

    out = [struct.pack("<I", 6), string("WhisperSpec"), struct.pack("<II", 3, len(variables))]
    for name, t in sorted(variables.items()):
        t = t.contiguous()
        raw = t.numpy().tobytes()
        out += [string(name), struct.pack("<B", t.dim()), struct.pack(f"<{t.dim()}I", *t.shape)]
        out += [struct.pack("<BI", dtype_ids[t.dtype], len(raw)), raw]
    out += [struct.pack("<I", 1), string("decoder/projection/weight")]
    out += [string("decoder/embeddings/weight")]
    path.write_bytes(b"".join(out))


@pytest.mark.parametrize("int8", [False, True])
def test_ct2_round_trip(tmp_path, int8):
    """A random model written in CTranslate2's format converts back to the same weights."""
    model = random_tiny_pair(seed=5).target
    sd = {k: t.detach().clone() for k, t in model.state_dict().items()}
    ct2 = tmp_path / "ct2"
    ct2.mkdir()
    _write_ct2(ct2 / "model.bin", _ct2_variables(sd, model.config), int8)
    base = offline_files("base")
    shutil.copy(base.tokenizer, ct2 / "tokenizer.json")
    (ct2 / "config.json").write_text(json.dumps({"suppress_ids": [1, 2], "suppress_ids_begin": [220]}))
    pair = load_pair(str(convert_ct2(ct2, tmp_path / "hf")), draft=None)
    assert pair.begin_suppress_tokens == (220,) and pair.suppress_tokens == (1, 2)
    got = pair.target.state_dict()
    assert got.keys() == sd.keys()
    cfg = pair.target.config
    assert (cfg.d_model, cfg.encoder_layers, cfg.decoder_attention_heads) == (64, 2, 4)
    for k, ref in sd.items():
        if int8 and re.search(r"(proj|fc\d)\.weight$", k):  # within half a quantisation step
            step = ref.abs().amax(dim=1, keepdim=True) / 127
            assert ((got[k] - ref).abs() <= step / 2 + 1e-6).all(), k
        else:
            assert torch.equal(got[k], ref), k
