"""CTranslate2 (faster-whisper) Whisper checkpoints -> Hugging Face Whisper directories.

The output is what `transformers`' `WhisperForConditionalGeneration.from_pretrained` loads,
and what specasr's own `models.whisper.load_whisper` loads. Nothing here needs transformers:
the config files are written as JSON with Hugging Face's keys.

`model.bin` layout (little-endian; strings are u16 length incl. NUL, then bytes, then NUL):
    u32 binary_version, str spec_name, u32 spec_revision, u32 n_variables,
    n_variables x (str name, u8 rank, rank x u32 dim, u8 dtype_id, u32 n_bytes, raw bytes),
    u32 n_aliases, n_aliases x (str alias, str target_name)

CTranslate2 fuses projections that Hugging Face keeps apart: self-attention `linear_0` is
[Q; K; V] stacked on dim 0, cross-attention `linear_1` is [K; V]. K's bias is dropped: it is
zero in converted checkpoints, and any K bias adds q.b_k to every key score of a query,
which softmax cancels. int8/int16 checkpoints are dequantised with their `weight_scale`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors.torch import save_file

from specasr.cache import default_cache_root, store
from specasr.models.whisper import write_transposed
from specasr.tokenizer import TASKS, Tokenizer

# bump when the output format changes; it is part of the cache key
# (4: fp32, Wᵀ; 5: no Wᵀ of the embedding; 6: records source_dtype)
CONVERTER_VERSION = 6
_CT2_DTYPES = (torch.float32, torch.int8, torch.int16, torch.int32, torch.float16, torch.bfloat16)
_LAYER = re.compile(r"^(encoder|decoder)/layer_(\d+)/")


@dataclass(frozen=True)
class CT2Files:
    """The files of one CTranslate2 Whisper model; `model_parts` concatenate into model.bin."""

    model_parts: tuple[Path, ...]
    config: Path
    tokenizer: Path

    @classmethod
    def from_dir(cls, ct2_dir: str | Path) -> CT2Files:
        d = Path(ct2_dir)
        if not (d / "model.bin").is_file():
            raise FileNotFoundError(f"{d} has no model.bin; not a CTranslate2 model directory")
        return cls((d / "model.bin",), d / "config.json", d / "tokenizer.json")


def as_ct2_files(source: str | Path | CT2Files) -> CT2Files:
    return source if isinstance(source, CT2Files) else CT2Files.from_dir(source)


# ---- reading model.bin ------------------------------------------------------------------
class _ChainedReader:
    """Reads a byte stream that is split over several files, in order."""

    def __init__(self, paths: tuple[Path, ...]):
        self._paths = list(paths)
        self._file: BinaryIO | None = None

    def read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            if self._file is None:
                if not self._paths:
                    raise EOFError("model.bin ended early; are all parts present and in order?")
                self._file = open(self._paths.pop(0), "rb")
            chunk = self._file.read(n - len(out))
            if not chunk:
                self._file.close()
                self._file = None
            out += chunk
        return bytes(out)

    def unpack(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.read(self.unpack("H"))[:-1].decode("utf-8")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def read_ct2_variables(parts: tuple[Path, ...]) -> tuple[str, dict[str, torch.Tensor]]:
    """Returns (spec name, {variable name: tensor}), aliases resolved to the same tensor."""
    r = _ChainedReader(parts)
    try:
        version = r.unpack("I")
        if version < 5:
            raise ValueError(f"CTranslate2 binary version {version} is not supported (need >= 5)")
        spec = r.string()
        r.unpack("I")  # spec revision
        variables: dict[str, torch.Tensor] = {}
        for _ in range(r.unpack("I")):
            name = r.string()
            shape = [r.unpack("I") for _ in range(r.unpack("B"))]
            dtype = _CT2_DTYPES[r.unpack("B")]
            data = bytearray(r.read(r.unpack("I")))
            variables[name] = torch.frombuffer(data, dtype=dtype).reshape(shape)
        for _ in range(r.unpack("I")):
            alias, target = r.string(), r.string()
            variables[alias] = variables[target]
    finally:
        r.close()
    return spec, variables


def _dequantize(variables: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """int8 weights are stored as round(w * scale) with one scale per output row."""
    out = dict(variables)
    for name in [n for n in variables if n.endswith("/weight_scale")]:
        scale = out.pop(name).float()
        w = name.removesuffix("_scale")
        out[w] = out[w].float() / (scale[:, None] if scale.dim() == 1 else scale)
    return out


# ---- configs ----------------------------------------------------------------------------
def whisper_config(
    tokenizer: Tokenizer,
    *,
    d_model: int,
    encoder_layers: int,
    decoder_layers: int,
    encoder_heads: int,
    decoder_heads: int,
    ffn_dim: int,
    n_mels: int,
    vocab_size: int,
    max_source_positions: int = 1500,
    max_target_positions: int = 448,
) -> dict:
    """A Hugging Face Whisper config.json (as a dict) whose special-token ids come from the
    tokenizer, by name. `transformers.WhisperConfig(**it)` is the same configuration."""
    return dict(
        model_type="whisper",
        activation_function="gelu",
        vocab_size=vocab_size,
        num_mel_bins=n_mels,
        d_model=d_model,
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        encoder_attention_heads=encoder_heads,
        decoder_attention_heads=decoder_heads,
        encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=ffn_dim,
        max_source_positions=max_source_positions,
        max_target_positions=max_target_positions,
        decoder_start_token_id=tokenizer.sot,
        bos_token_id=tokenizer.eot,
        eos_token_id=tokenizer.eot,
        pad_token_id=tokenizer.eot,
        begin_suppress_tokens=None,
        suppress_tokens=None,
        tie_word_embeddings=True,
        architectures=["WhisperForConditionalGeneration"],
    )


def whisper_generation_config(tokenizer: Tokenizer, ct2_config: dict, max_length: int = 448) -> dict:
    """generation_config.json (as a dict) as Hugging Face's Whisper checkpoints ship it (no
    forced ids). `transformers.GenerationConfig(**it)` is the same configuration."""
    multilingual = tokenizer.multilingual
    extra: dict = {}
    if multilingual:
        extra["lang_to_id"] = {f"<|{c}|>": i for c, i in tokenizer.language_tokens.items()}
        extra["task_to_id"] = {t: getattr(tokenizer, t) for t in TASKS}
    heads = ct2_config.get("alignment_heads")
    return dict(
        decoder_start_token_id=tokenizer.sot,
        bos_token_id=tokenizer.eot,
        eos_token_id=tokenizer.eot,
        pad_token_id=tokenizer.eot,
        suppress_tokens=list(ct2_config.get("suppress_ids", [])),
        begin_suppress_tokens=list(ct2_config.get("suppress_ids_begin", [])),
        no_timestamps_token_id=tokenizer.no_timestamps,
        prev_sot_token_id=tokenizer.sot_prev,
        is_multilingual=multilingual,
        alignment_heads=[list(h) for h in heads] if heads else None,
        max_initial_timestamp_index=50,
        return_timestamps=False,
        max_length=max_length,
        forced_decoder_ids=None,
        **extra,
    )


def _count_layers(variables: dict[str, torch.Tensor], stack: str) -> int:
    ids = {int(m.group(2)) for n in variables if (m := _LAYER.match(n)) and m.group(1) == stack}
    if ids != set(range(len(ids))) or not ids:
        raise ValueError(f"{stack} layers are missing or not numbered from 0: {sorted(ids)}")
    return len(ids)


def _config_from_variables(v: dict[str, torch.Tensor], tokenizer: Tokenizer) -> dict:
    """Every size comes from tensor shapes; heads from the spec's `*/num_heads` scalars."""
    emb = v["decoder/embeddings/weight"]  # [vocab, d_model]
    return whisper_config(
        tokenizer,
        d_model=emb.shape[1],
        vocab_size=emb.shape[0],
        encoder_layers=_count_layers(v, "encoder"),
        decoder_layers=_count_layers(v, "decoder"),
        encoder_heads=int(v["encoder/num_heads"]),
        decoder_heads=int(v["decoder/num_heads"]),
        ffn_dim=v["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        n_mels=v["encoder/conv1/weight"].shape[1],  # [d_model, n_mels, 3]
        max_source_positions=v["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=v["decoder/position_encodings/encodings"].shape[0],
    )


# ---- weight mapping ---------------------------------------------------------------------
def _attention(v: dict, src: str, dst: str, fused: str) -> dict[str, torch.Tensor]:
    """fused = 'qkv' (self-attention: linear_0=[Q;K;V], linear_1=out) or
    'q_kv' (cross-attention: linear_0=Q, linear_1=[K;V], linear_2=out)."""
    lins = ("linear_0",) if fused == "qkv" else ("linear_0", "linear_1")
    out_lin = "linear_1" if fused == "qkv" else "linear_2"
    ws = torch.cat([v[f"{src}/{lin}/weight"] for lin in lins]).chunk(3)  # 3 x [d, d]
    bs = torch.cat([v[f"{src}/{lin}/bias"] for lin in lins]).chunk(3)  # 3 x [d]
    out: dict[str, torch.Tensor] = {}
    for n, wi, bi in zip(("q", "k", "v"), ws, bs, strict=True):
        out[f"{dst}.{n}_proj.weight"] = wi
        if n != "k":  # HF has no K bias; see the module docstring
            out[f"{dst}.{n}_proj.bias"] = bi
    out[f"{dst}.out_proj.weight"] = v[f"{src}/{out_lin}/weight"]
    out[f"{dst}.out_proj.bias"] = v[f"{src}/{out_lin}/bias"]
    return out


def _norm(v: dict, src: str, dst: str) -> dict[str, torch.Tensor]:
    return {f"{dst}.weight": v[f"{src}/gamma"], f"{dst}.bias": v[f"{src}/beta"]}


def _ffn(v: dict, src: str, dst: str) -> dict[str, torch.Tensor]:
    out = _norm(v, f"{src}/layer_norm", f"{dst}.final_layer_norm")
    for ct2, hf in (("linear_0", "fc1"), ("linear_1", "fc2")):
        out[f"{dst}.{hf}.weight"] = v[f"{src}/{ct2}/weight"]
        out[f"{dst}.{hf}.bias"] = v[f"{src}/{ct2}/bias"]
    return out


def ct2_to_hf_state_dict(v: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    """HF parameter names -> tensors. proj_out is omitted: it is tied to embed_tokens."""
    sd: dict[str, torch.Tensor] = {}
    enc, dec = "model.encoder", "model.decoder"
    for conv in ("conv1", "conv2"):
        sd[f"{enc}.{conv}.weight"] = v[f"encoder/{conv}/weight"]
        sd[f"{enc}.{conv}.bias"] = v[f"encoder/{conv}/bias"]
    sd[f"{enc}.embed_positions.weight"] = v["encoder/position_encodings/encodings"]
    sd |= _norm(v, "encoder/layer_norm", f"{enc}.layer_norm")
    for i in range(cfg["encoder_layers"]):
        src, dst = f"encoder/layer_{i}", f"{enc}.layers.{i}"
        sd |= _attention(v, f"{src}/self_attention", f"{dst}.self_attn", "qkv")
        sd |= _norm(v, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
        sd |= _ffn(v, f"{src}/ffn", dst)
    sd[f"{dec}.embed_tokens.weight"] = v["decoder/embeddings/weight"]
    sd[f"{dec}.embed_positions.weight"] = v["decoder/position_encodings/encodings"]
    sd |= _norm(v, "decoder/layer_norm", f"{dec}.layer_norm")
    for i in range(cfg["decoder_layers"]):
        src, dst = f"decoder/layer_{i}", f"{dec}.layers.{i}"
        sd |= _attention(v, f"{src}/self_attention", f"{dst}.self_attn", "qkv")
        sd |= _norm(v, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
        sd |= _attention(v, f"{src}/attention", f"{dst}.encoder_attn", "q_kv")
        sd |= _norm(v, f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
        sd |= _ffn(v, f"{src}/ffn", dst)
    return sd


def _feature_extractor_config(n_mels: int) -> dict:
    """preprocessor_config.json as transformers' WhisperFeatureExtractor writes it by default."""
    return {
        "chunk_length": 30,
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": n_mels,
        "hop_length": 160,
        "n_fft": 400,
        "n_samples": 480000,
        "nb_max_frames": 3000,
        "padding_side": "right",
        "padding_value": 0.0,
        "processor_class": "WhisperProcessor",
        "return_attention_mask": False,
        "sampling_rate": 16000,
    }


# ---- conversion -------------------------------------------------------------------------
def convert_ct2(source: str | Path | CT2Files, out_dir: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Writes a `from_pretrained`-loadable directory; `dtype=None` keeps the stored precision
    (float32 for quantised checkpoints). The directory appears atomically, whole or not at all."""
    files = as_ct2_files(source)
    spec, variables = read_ct2_variables(files.model_parts)
    if spec != "WhisperSpec":
        raise ValueError(f"expected a CTranslate2 WhisperSpec model, got {spec!r}")
    variables = _dequantize(variables)
    tokenizer = Tokenizer.from_file(files.tokenizer)
    ct2_config = json.loads(files.config.read_text()) if files.config.is_file() else {}
    cfg = _config_from_variables(variables, tokenizer)
    if dtype is None:
        dtype = variables["decoder/embeddings/weight"].dtype
    # every stored weight an fp16 value: the fp32 cache may keep the encoder in fp16 at run time, losslessly
    fp16_source = all(t.dtype == torch.float16 for t in variables.values() if t.is_floating_point())
    sd = {k: t.to(dtype).clone() for k, t in ct2_to_hf_state_dict(variables, cfg).items()}
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        meta = {"format": "pt", "source_dtype": "float16" if fp16_source else "mixed"}
        save_file(sd, str(tmp / "model.safetensors"), metadata=meta)
        if dtype == torch.float32:  # the CPU decoder's layout, read in place at load
            write_transposed(tmp, sd)
        gen = whisper_generation_config(tokenizer, ct2_config, cfg["max_target_positions"])
        for name, data in (
            ("config.json", cfg),
            ("generation_config.json", gen),
            ("preprocessor_config.json", _feature_extractor_config(cfg["num_mel_bins"])),
        ):
            (tmp / name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        shutil.copyfile(files.tokenizer, tmp / "tokenizer.json")
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary user dir
        os.replace(tmp, out)  # atomic on one filesystem; fails if `out` is a non-empty dir
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# ---- content-keyed cache ----------------------------------------------------------------
def _sha256(paths: tuple[Path, ...], memo: dict[str, str]) -> str:
    """sha256 of the files' bytes concatenated in order, memoised under each file's
    (resolved path, size, mtime_ns): an unchanged file is never read twice."""
    stats = [(p.resolve(), p.stat()) for p in paths]
    key = ";".join(f"{p}|{st.st_size}|{st.st_mtime_ns}" for p, st in stats)
    if key not in memo:
        h = hashlib.sha256()
        for path in paths:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
        memo[key] = h.hexdigest()
    return memo[key]


def file_digests(groups: list[tuple[Path, ...]], root: Path) -> list[str]:
    """The sha256 of each group of files (`_sha256`; "-" for an empty group), memoised in
    root/hashes.json."""
    memo_path = root / "hashes.json"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    known = len(memo)
    digests = [_sha256(g, memo) if g else "-" for g in groups]
    if len(memo) != known:  # a concurrent writer may drop an entry: only recomputed
        try:
            store(memo_path, json.dumps(memo, indent=0).encode())
        except OSError:  # a cache that cannot be written: hashed again next time
            pass
    return digests


def content_key(files: CT2Files, root: Path) -> str:
    """sha256 over CONVERTER_VERSION and the sha256 of model.bin (its parts joined),
    config.json and tokenizer.json. File hashes are memoised in root/hashes.json."""
    optional = [(p,) if p.is_file() else () for p in (files.config, files.tokenizer)]
    digests = file_digests([tuple(files.model_parts), *optional], root)
    return hashlib.sha256("\n".join([f"v{CONVERTER_VERSION}", *digests]).encode()).hexdigest()


def cached_conversion(source: str | Path | CT2Files, cache_root: str | Path | None = None) -> Path:
    """Converts once into <cache>/hf/<content key>/ and returns that directory thereafter.
    The cache holds fp32 weights, the precision a CPU runs: loading then reads them straight
    into place, with no conversion pass (other dtypes convert on load)."""
    files = as_ct2_files(source)
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    out = root / "hf" / content_key(files, root)[:32]
    if (out / "model.safetensors").is_file():
        return out
    try:
        return convert_ct2(files, out, dtype=torch.float32)
    except OSError:
        if (out / "model.safetensors").is_file():  # another process won the rename race
            return out
        raise
