"""A distilled draft: a shallow Whisper decoder with a reduced output vocabulary.

The draft reuses its target's encoder states, token embeddings and positional table (none
of them are stored with the draft), and owns only:

- 1 or 2 decoder layers (initialised from target layers, then trained, see
  `specasr.recipes.distill_draft`), and its final LayerNorm;
- `vocab_ids` [N]: the tokens it can propose. Its head is the target's tied output
  projection restricted to those rows, so q is zero outside them. That is allowed: the
  verifier only needs q(d) > 0 for the drafted token d, and the residual max(p − q, 0)
  then gives those tokens their full target mass (exact at every temperature).

It runs in `specasr.runtime.runner.LeanRunner`, a preallocated-KV-cache loop with the interface
of `specasr.decode.runners.Runner` (call, rollback, keep; a length per row), so a draft
step costs its arithmetic plus a few dozen kernel launches, not a Hugging Face module tree. On CPU
`quantize_int8` makes its products int8 (lossy: it moves α, never the output) and runs each
layer as one TorchScript function (`specasr.backends.cpu.scripted`), with the same ops and without
Python between them.

A draft may attend over pooled frames (`cross_pool` p > 1, the recipe's `--cross-pool`): the
means of p adjacent frames' cross-attention K and V, 1500 / p instead of 1500. A draft step
reads every K/V row it attends over, so that cuts the largest part of what it reads; it must be
trained so (the target's own attention is never pooled, so exactness is untouched).

On a CPU with native bf16 dot products an int8 draft also keeps one row's K/V in bf16
(`cross_dtype`, set by `quantize_int8`): half the bytes that every one-row step's
cross-attention reads, the draft's only (docs/benchmarks.md has the step it saves). A batch's
rows keep fp32, which torch's attention reads faster, until one row is left.

File format: safetensors with the draft's own tensors (fp16) and metadata
{"format": "specasr-draft", "version", "d_model", "heads", "ffn", "layers", "vocab_size",
"target", "init_layers", "cross_pool" (absent: 1)}.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specasr.backends.cpu.fused import FusedDraft
from specasr.backends.cpu.linear import Int8Linear, swap_linears
from specasr.constants import COST_KEYS
from specasr.models.mapped import gather_rows
from specasr.models.stored_int8 import HEAD, Forms, Rows
from specasr.runtime.forms import LayerForm, choose
from specasr.runtime.layers import DecoderLayer, embed, fuse_qkv, no_init
from specasr.runtime.runner import LeanRunner, LentCross

FORMAT = "specasr-draft"
VERSION = 1


def _equal_as(mine: Tensor, theirs: Tensor, stored: torch.dtype) -> bool:
    """mine == theirs after theirs makes a round trip through the `stored` dtype."""
    return mine.shape == theirs.shape and torch.equal(mine, theirs.to(stored).to(mine.dtype))


POOLS = (1, 2, 3, 4, 5, 6)  # `cross_pool`s that divide Whisper's 1500 encoder frames


class DistilledDraft(nn.Module):
    """Shallow decoder + reduced head. `attach(target)` binds the target's shared tensors."""

    def __init__(self, d_model: int, heads: int, ffn: int, layers: int, vocab_ids: Tensor, vocab_size: int):
        super().__init__()
        self.d_model, self.heads, self.ffn, self.vocab_size = d_model, heads, ffn, vocab_size
        self.layers = nn.ModuleList(DecoderLayer(d_model, heads, ffn) for _ in range(layers))
        self.layer_norm = nn.LayerNorm(d_model)
        self.register_buffer("vocab_ids", vocab_ids.long().clone())  # [N]
        self.meta: dict[str, str] = {}
        self._shared: dict[str, Tensor] = {}  # embed [V, d], positions [448, d], head [d, N]
        self._head_int8: Int8Linear | None = None
        self.cross_from: list[int | None] = [None] * layers  # set by attach()
        self.cross_pool = 1  # frames per cross-attention K/V row (`pool_cross`)
        # the dtype its one-row runners keep cross K/V in (`quantize_int8`); None: as computed
        self.cross_dtype: torch.dtype | None = None
        self.fused: FusedDraft | None = None  # `quantize_int8`'s C step for one-token passes
        self._script = True  # `quantize_int8(script=)`: its int8 layers as TorchScript steps

    # ---- binding to a target ------------------------------------------------------------
    def attach(self, target, head: bool = True) -> DistilledDraft:
        """Binds the target's token embeddings (= tied output projection) and positional
        table; they are not parameters of the draft and are never saved with it. head False:
        the head's rows are not gathered, for a `quantize_int8` given them stored."""
        cfg = target.config
        if (cfg.d_model, cfg.vocab_size) != (self.d_model, self.vocab_size):
            raise ValueError(
                f"this draft was made for d_model={self.d_model}, vocab={self.vocab_size}; "
                f"the target has d_model={cfg.d_model}, vocab={cfg.vocab_size}"
            )
        dec = target.model.decoder
        embed = dec.embed_tokens.weight
        self._shared = {"embed": embed, "positions": dec.embed_positions.weight}
        if head:  # [N, d]: the rows as gathered, which int8 quantisation reads per row (a
            # transposed copy would add to every load)
            self._shared["head"] = gather_rows(embed, self.vocab_ids.to(embed.device))
        self.cross_from = [self._same_cross(layer, dec, i) for i, layer in enumerate(self.layers)]
        return self

    @property
    def form(self) -> LayerForm:
        """How its layers run (`specasr.runtime.forms`), from the weights as they are now (device,
        dtype, int8 after `quantize_int8`), so a draft moved or quantised never reports a stale one."""
        return choose(self.layers, self._script)

    @property
    def languages(self) -> tuple[str, ...] | None:
        """The languages its recipe trained it on (`recipe` metadata, "language": a code or a
        comma-separated list), or None when the file does not say."""
        try:
            lang = json.loads(self.meta.get("recipe", "{}")).get("language")
        except (ValueError, AttributeError):
            return None
        return tuple(x.strip() for x in lang.split(",") if x.strip()) if isinstance(lang, str) else None

    def _same_cross(self, layer: DecoderLayer, dec, i: int) -> int | None:
        """The target layer whose cross-attention K/V projections this draft layer kept (the
        recipe freezes them; the file stores them in fp16), or None."""
        init = self.meta.get("init_layers", "").split(",")
        if i >= len(init) or not init[i].lstrip("-").isdigit():
            return None
        j = int(init[i]) % len(dec.layers)
        mine, theirs = layer.encoder_attn, dec.layers[j].encoder_attn
        pairs = [(mine.k_proj.weight, theirs.k_proj.weight), (mine.v_proj.weight, theirs.v_proj.weight)]
        pairs.append((mine.v_proj.bias, theirs.v_proj.bias))
        for stored in (torch.float16, None):  # as the file keeps them, or exactly (not saved yet)
            if all(_equal_as(a, b, stored or a.dtype) for a, b in pairs):
                return j
        return None

    def embed(self, tokens: Tensor, start: int | Tensor) -> Tensor:
        """tokens [B, T] at positions start … start+T-1 (or per-row positions [B, T]) -> hidden [B, T, d]."""
        return embed(self._shared["embed"], self._shared["positions"], tokens, start)

    def head(self, x: Tensor) -> Tensor:
        """x [B, T, d] -> logits over the draft's vocabulary [B, T, N]."""
        if self._head_int8 is not None:
            return self._head_int8(self.layer_norm(x))
        return F.linear(self.layer_norm(x), self._shared["head"])

    def full_logits(self, sub: Tensor) -> Tensor:
        """[B, T, N] -> [B, T, V] with −inf outside the draft's vocabulary."""
        out = sub.new_full((*sub.shape[:-1], self.vocab_size), -math.inf)
        return out.index_copy_(-1, self.vocab_ids, sub)  # half the time of out[..., ids] = sub

    def cross_kv(self, states: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Encoder states [B, S, d] -> per layer the cross-attention K, V [B, H, S, dh], not
        pooled (`forward` and `runner` pool them)."""
        return [layer.cross_kv(states) for layer in self.layers]

    def pool_cross(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """K, V [B, H, S, dh] (any strides) -> the means of `cross_pool` adjacent frames
        [B, H, S / cross_pool, dh], contiguous; unchanged when cross_pool is 1. Keys have no
        bias, so a pooled key is the key of the pooled states (values: plus their bias)."""
        p = self.cross_pool
        if p == 1:
            return k, v
        S = k.shape[2]
        if S % p:
            raise ValueError(f"{S} encoder frames do not pool by {p}")
        if p == 2:  # (a + b) / 2 as the mean takes it, over the even and odd frames' rows:
            # several times faster than a mean over a strided axis (a K given as a view of
            # Kᵀ above all), the same bits (tested)
            return tuple(torch.add(t[:, :, 0::2], t[:, :, 1::2]).mul_(0.5).contiguous() for t in (k, v))
        return tuple(t.unflatten(2, (S // p, p)).mean(3).contiguous() for t in (k, v))

    def forward(self, tokens: Tensor, cross: list[tuple[Tensor, Tensor]]) -> Tensor:
        """Teacher-forced pass (training): tokens [B, T] from position 0, per-layer cross K/V
        (`cross_kv`) -> logits over the draft vocabulary [B, T, N]."""
        x = self.embed(tokens, 0)
        T = tokens.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        for layer, kv in zip(self.layers, cross):
            x = layer(x, *self.pool_cross(*kv), mask)
        return self.head(x)

    def logits(self, x: Tensor) -> Tensor:
        """x [B, T, d] -> logits [B, T, V], −inf off the draft's vocabulary (`LeanRunner`'s hook)."""
        return self.full_logits(self.head(x))

    _reduced_vocab: tuple[Tensor, list[int] | None] | None = None
    reduce_rows = True  # False: the loop filters full rows instead (`benchmarks.draft_rows`' A/B)

    def reduced_logits(self, x: Tensor) -> Tensor:
        """`LeanRunner(reduced=True)`'s hook: x [B, T, d] -> [B, T, N], column j scoring vocab_ids[j]."""
        return self.head(x)

    @property
    def reduced_vocab(self) -> list[int] | None:
        """vocab_ids as a list when ascending (what `decode.filters.on_vocab` needs), else None:
        the speculative loop then filters full rows. Built once per vocab_ids tensor."""
        if not self.reduce_rows:
            return None
        cached = self._reduced_vocab
        if cached is None or cached[0] is not self.vocab_ids:
            ids = self.vocab_ids.tolist()
            ascending = all(a < b for a, b in zip(ids, ids[1:]))
            cached = (self.vocab_ids, ids if ascending else None)
            self._reduced_vocab = cached
        return cached[1]

    def runner(
        self, states: Tensor, target_cross: list | None = None, form: LayerForm | None = None
    ) -> LeanRunner:
        """target_cross: the target runner's per-layer cross K/V on the same states; layers
        that kept a target layer's projections (`cross_from`) reuse them instead of computing
        their own. That saves a K/V product over every encoder frame per window and keeps
        the K/V exact fp32 (the time saved depends on the machine: docs/benchmarks.md)."""
        cross = None
        if target_cross is not None:
            cross = [None if j is None else target_cross[j] for j in self.cross_from]
        # one row keeps them in cross_dtype, for the C step's bytes; rows of a batch, which the
        # torch path reads through attention whose bf16 kernel is slower than its fp32 one, in fp32
        # (measured: docs/benchmarks.md), until one is left (`LeanRunner.keep`)
        one_row = self.cross_dtype if states.shape[0] == 1 else None
        derived = self.cross_pool > 1 or one_row is not None
        if derived:
            # [B, H, S / p, dh] per layer (in cross_dtype for one row): the runner keeps them as given
            with torch.inference_mode():
                own = [None] * len(self.layers) if cross is None else cross
                cross = [
                    self.pool_cross(*(layer.cross_kv(states) if kv is None else kv))
                    for kv, layer in zip(own, self.layers)
                ]
                if one_row is not None:
                    cross = [(k.to(one_row), v.to(one_row)) for k, v in cross]
        # read as given, a lent K/V stays the target runner's (it moves their rows on `keep`);
        # derived ones are fresh, the runner's own
        lent = isinstance(target_cross, LentCross) and not derived
        return LeanRunner(self, states, cross, form, lent=lent, mine=derived)

    def quantize_int8(
        self,
        script: bool = True,
        bf16_cross: bool | None = None,
        fused: bool = True,
        stored: Forms | None = None,
    ) -> DistilledDraft:
        """Inference on CPU with int8 weights (`specasr.backends.cpu.linear.Int8Linear`): lossy, which
        moves the acceptance rate but never the transcript. Attach first; no training
        afterwards. script: each layer runs as one TorchScript function
        (`specasr.backends.cpu.scripted`), bitwise the same as the eager layer and faster per
        one-token step, without Python between the ops (measured: docs/benchmarks.md).
        bf16_cross: its runners keep the cross-attention K/V in bf16 (`cross_dtype`), which
        attention reads in bf16 with fp32 results: lossy like the int8 products, and a
        cheaper step where bf16 is native; None: where the CPU computes bf16 natively
        (`specasr.backends.cpu.bf16.available`), where it is emulated it would be slower. fused: its
        one-token steps run as one C call (`specasr.backends.cpu.fused`) where a compiler is found.
        stored: the rows an earlier load quantised (`int8_rows`, `specasr.models.stored_int8`),
        read in place of quantising: the same tensors, so the same draft."""
        from specasr.backends.cpu import bf16

        if not self._shared:
            raise RuntimeError("attach the draft to its target before quantizing it")
        if self.layer_norm.weight.device.type != "cpu":
            raise ValueError("int8 drafts run on CPU only")
        for layer in self.layers:
            fuse_qkv(layer.self_attn, lambda fused: fused)  # quantised with the rest, below
        # the fused step reads the int8 rows; the torch path packs the same rows on first use
        make = Int8Linear.kept_of if fused else Int8Linear.of
        # fbgemm packs each matrix on one core (the head is the largest): all of them at once
        with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
            if stored is not None:  # the same rows, quantised by an earlier load
                self._head_int8 = _from_rows(stored[HEAD])
                swap_linears(self.layers, lambda name, _: _from_rows(stored[f"layers.{name}"]), named=True)
            else:
                head = pool.submit(Int8Linear, self._shared["head"], None, keep=fused)  # [N, d]
                swap_linears(self.layers, make, pool)
                self._head_int8 = head.result()
            self.fused = FusedDraft.of(self) if fused else None  # one-token steps in one C call
            if self.fused is None and (fused or stored is not None):  # fbgemm's copies only, now
                list(pool.map(Int8Linear.pack, self._int8_products().values()))
        self._shared.pop("head", None)  # the fp32 copy goes
        self.cross_dtype = (
            torch.bfloat16 if (bf16.available() if bf16_cross is None else bf16_cross) else torch.float32
        )
        self._script = script  # int8 layers as one TorchScript function each (`form`)
        return self

    def _int8_products(self) -> dict[str, Int8Linear]:
        """After `quantize_int8`: its int8 products by name, the head as `HEAD`."""
        named = {f"layers.{n}": m for n, m in self.layers.named_modules() if isinstance(m, Int8Linear)}
        return {HEAD: self._head_int8, **named}

    def int8_rows(self) -> Forms:
        """After `quantize_int8` with the fused step: the int8 rows it quantised (`Rows`' fields)
        by name, as `quantize_int8(stored=)` reads them; {} where its products hold fbgemm's
        copies only."""
        products = self._int8_products()
        if any(m.kept is None for m in products.values()):
            return {}
        return {name: Rows(*m.kept[:2], m.sums, m.kept[2]).fields() for name, m in products.items()}

    # ---- files --------------------------------------------------------------------------
    def save(self, path: str | Path, **meta: str) -> None:
        from safetensors.torch import save_file

        tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in self.state_dict().items()}
        tensors["vocab_ids"] = self.vocab_ids.to(torch.int32).contiguous()
        info = {
            "format": FORMAT,
            "version": str(VERSION),
            "d_model": str(self.d_model),
            "heads": str(self.heads),
            "ffn": str(self.ffn),
            "layers": str(len(self.layers)),
            "vocab_size": str(self.vocab_size),
            **({"cross_pool": str(self.cross_pool)} if self.cross_pool > 1 else {}),
            **self.meta,
            **{k: str(v) for k, v in meta.items()},
        }
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata=info)
        tmp.replace(path)

    @classmethod
    def from_target(cls, target, layers: tuple[int, ...], vocab_ids: Tensor) -> DistilledDraft:
        """A draft initialised from the target's decoder layers `layers` and final norm."""
        cfg = target.config
        draft = cls(
            cfg.d_model,
            cfg.decoder_attention_heads,
            cfg.decoder_ffn_dim,
            len(layers),
            vocab_ids,
            cfg.vocab_size,
        )
        dec = target.model.decoder
        for mine, i in zip(draft.layers, layers):
            mine.load_state_dict(dec.layers[i].state_dict())
        draft.layer_norm.load_state_dict(dec.layer_norm.state_dict())
        draft.meta["init_layers"] = ",".join(map(str, layers))
        return draft.to(dec.layer_norm.weight.dtype)


def is_draft_file(path: Path) -> bool:
    if not (path.is_file() and path.suffix == ".safetensors"):
        return False
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return (f.metadata() or {}).get("format") == FORMAT


def _from_rows(fields: dict[str, Tensor]) -> Int8Linear:
    rows = Rows.of(fields)
    return Int8Linear.from_rows(rows.q, rows.scale, rows.bias, rows.sums)


def load_draft(
    path: str | Path, target, dtype: torch.dtype, device: torch.device, head: bool = True
) -> DistilledDraft:
    """Loads a draft file and binds it to `target` (same d_model and vocabulary; head False:
    `attach`'s, for int8 rows stored by an earlier load)."""
    from safetensors import safe_open

    path = Path(path)
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path} is not a specasr draft file")
        if int(meta.get("version", 0)) > VERSION:
            raise ValueError(f"{path} has draft format version {meta['version']}; upgrade specasr")
        # each tensor in its final dtype as it is read: the file's fp16 copies never pile up
        tensors = {
            k: t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)
            for k in f.keys()  # noqa: SIM118 (safe_open has no iterator)
            for t in (f.get_tensor(k),)
        }
    tensors["vocab_ids"] = tensors["vocab_ids"].long()
    with no_init():  # every weight comes from the file
        draft = DistilledDraft(
            int(meta["d_model"]),
            int(meta["heads"]),
            int(meta["ffn"]),
            int(meta["layers"]),
            tensors["vocab_ids"],
            int(meta["vocab_size"]),
        )
    draft.load_state_dict(tensors, assign=True)  # the module's own (untouched) tensors go
    draft.meta = {k: v for k, v in meta.items() if k in ("target", "init_layers", "recipe", *COST_KEYS)}
    draft.cross_pool = int(meta.get("cross_pool", 1))
    draft.eval().requires_grad_(False)
    return draft.attach(target, head=head)
