"""The runner every device uses: one decoder's preallocated KV cache and its passes.

`LeanRunner` runs any decoder that offers `layers` (`specasr.runtime.layers.DecoderLayer`s),
`heads`, `d_model`, `embed(tokens, start)` and `logits(hidden)`, each layer through the step
its layer form gives (`specasr.runtime.forms`). Three decoders do:

- the model's own `specasr.models.whisper.WhisperDecoder` (CUDA, fp16: the reference layers);
- `specasr.models.draft.DistilledDraft`, the distilled draft;
- `LeanDecoder`, a CPU view of a Whisper decoder. It shares the model's layer norms,
  embeddings and positions, and holds its matrices as `specasr.backends.cpu.linear` products
  (packed, Wᵀ or int8). In fp32 it computes the same function as the reference layers, up to
  the order of summation inside the products: the target stays the target. The output
  projection does not repack its weight on every call, and there is no module tree, cache
  object or mask builder between the ops.

The cache is indexed by position, so rollback moves a length and recomputes nothing. Each
row has its own length (ragged rows): a batch whose rows accepted different numbers of
draft tokens keeps them all. When the rows' lengths agree (always at B = 1) a pass writes
one slice of the cache and needs at most one causal mask [T, P+T]; when they differ, it
scatters each row's keys and values to its own positions and masks per row [B, 1, T, P+T].
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specasr.backends.cpu.linear import Int8Linear, PackedLinear, TransposedLinear, head_form, shared_form
from specasr.backends.cpu.scripted import fixed_mask
from specasr.backends.process import plain_calls
from specasr.constants import N_TEXT_CTX
from specasr.runtime.forms import LayerForm, choose
from specasr.runtime.layers import DecoderLayer, by_window, embed


def _form(linear: nn.Module) -> nn.Module:
    """A layer matrix's product form: the model's own when the loader packed or quantised it
    (`PackedLinear`, `Int8Linear`), else a contiguous Wᵀ sharing the Linear's storage."""
    return linear if isinstance(linear, (PackedLinear, Int8Linear)) else shared_form(TransposedLinear, linear)


class LeanDecoder:
    """A Whisper decoder as plain layers with `specasr.backends.cpu.linear` products (CPU, fp32
    activations; fp32 or, for an int8 target, per-row int8 weights), run in one layer form
    (`specasr.runtime.forms`)."""

    def __init__(self, model, script: bool = True, form: LayerForm | None = None) -> None:
        """form: how the layers run (`specasr.runtime.forms`), as the load chose it; None:
        chosen here the same way (script False: the reference layers)."""
        cfg, dec = model.config, model.model.decoder
        self.d_model, self.heads = cfg.d_model, cfg.decoder_attention_heads
        self.layers = nn.ModuleList()
        for hf in dec.layers:
            parts = {
                n: getattr(hf, n)
                for n in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")
            }
            for name in ("self_attn", "encoder_attn"):  # fresh containers: the model keeps its own
                box = nn.Module()
                for proj in ("qkv_proj", "q_proj", "k_proj", "v_proj", "out_proj"):
                    linear = getattr(getattr(hf, name), proj, None)
                    if linear is None:  # fused q, k, v (int8) or not
                        continue
                    if name == "encoder_attn" and proj in ("k_proj", "v_proj"):
                        box.add_module(proj, linear)  # only ever 1500 rows (cross K/V): plain F.linear
                    else:
                        box.add_module(proj, _form(linear))
                parts[name] = box
            parts["fc1"], parts["fc2"] = _form(hf.fc1), _form(hf.fc2)
            # no fresh weights: every part is the model's
            self.layers.append(DecoderLayer(self.d_model, self.heads, 0, parts=parts))
        self.form = form if form is not None else choose(self.layers, script, lean=True)
        self.steps = self.form.steps(self.layers)
        self.embed_tokens = dec.embed_tokens.weight  # [V, d]
        self.positions = dec.embed_positions.weight  # [448, d]
        self.layer_norm = dec.layer_norm
        self.head = head_form(model.proj_out)  # [d] -> [V]; Whisper's proj_out has no bias

    @staticmethod
    def supports(model) -> bool:
        """Whisper decoders the lean layers reproduce: pre-norm, GELU, fp32 on CPU."""
        cfg = getattr(model, "config", None)
        return (
            getattr(cfg, "model_type", None) == "whisper"
            and cfg.activation_function == "gelu"
            and model.proj_out.bias is None
            and model.proj_out.weight.device.type == "cpu"
            and model.proj_out.weight.dtype == torch.float32
        )

    def embed(self, tokens: Tensor, start: int | Tensor) -> Tensor:
        """tokens [B, T] at positions start … start+T-1 (or per-row positions [B, T]) -> hidden [B, T, d]."""
        return embed(self.embed_tokens, self.positions, tokens, start)

    def logits(self, x: Tensor) -> Tensor:
        """x [B, T, d] -> logits [B, T, V]."""
        return self.head(self.layer_norm(x))

    _cross: CrossProducts | None = None  # built on first use (`cross_kv`)

    def cross_kv(self, states: Tensor, kt: bool) -> list[tuple[Tensor, Tensor]]:
        """Every layer's cross K, V for encoder states [B, S, d] (a window's set-up), each
        layer's as `DecoderLayer.cross_kv(states, kt)` lays it out and computes it: from one
        product for every layer's keys and one for their values (`CrossProducts`) for bf16
        projections, window by window as the layers project a batch, else layer by layer."""
        if self._cross is None:
            self._cross = CrossProducts.of(self.layers) or CrossProducts.NONE
        if self._cross is CrossProducts.NONE:
            return [layer.cross_kv(states, kt) for layer in self.layers]
        return by_window(lambda x: self._cross(x, kt), states)


class CrossProducts:
    """Every decoder layer's bf16 cross-attention K/V projection (`specasr.backends.cpu.bf16.Bf16Linear`,
    compute types bfloat16 and int8_bfloat16) as one product for all keys and one for all
    values, [S, d] × [d, L·d] each, where layer by layer a window's set-up ran 2L products of
    [S, d] × [d, d]: fewer, larger products cut a window's set-up time (measured:
    docs/benchmarks.md). Each output is the same dot product over d terms, and the
    bits are the layers' own (tested). The layers' weights become views of the joined ones,
    so nothing is held twice.

    One row a call: from some B on oneDNN's kernel for [d, d] × [B, d, S] sums in another order
    (B = 8 gave other bits than the layers' products), so a batch is projected window by
    window (`LeanDecoder.cross_kv`, `layers.by_window`), as `DecoderLayer.cross_kv` projects one. fp32
    projections keep the layers' products: joining them was no faster (measured:
    docs/benchmarks.md)."""

    NONE: CrossProducts  # the marker for layers this cannot serve (set below)

    def __init__(self, wk: Tensor, wv: Tensor, bv: Tensor | None, layer: DecoderLayer | None) -> None:
        self.wk, self.wv, self.bv = wk, wv, bv  # [L·d, d] each, bf16; the V bias [L·d] fp32 or None
        self.layer = layer  # any of the layers: their heads and `_split` ([B, S, d] -> [B, H, S, dh])

    @classmethod
    def of(cls, layers) -> CrossProducts | None:
        from specasr.backends.cpu.bf16 import Bf16Linear

        projs = [(layer.encoder_attn.k_proj, layer.encoder_attn.v_proj) for layer in layers]
        if not projs or {type(p) for pair in projs for p in pair} != {Bf16Linear}:
            return None
        if any(k.bias is not None for k, _ in projs) or any(v.out != torch.float32 for _, v in projs):
            return None
        biases = [v.bias for _, v in projs]
        if any(b is None for b in biases) and not all(b is None for b in biases):
            return None
        with torch.no_grad():
            wk = torch.cat([k.weight.detach() for k, _ in projs])  # [L·d, d]
            wv = torch.cat([v.weight.detach() for _, v in projs])  # [L·d, d]
            bv = None if biases[0] is None else torch.cat([b.detach() for b in biases])
            d = wk.shape[1]
            for i, (k, v) in enumerate(projs):  # the layers read views of the joined weights
                k.weight = nn.Parameter(wk[i * d : (i + 1) * d], requires_grad=False)
                v.weight = nn.Parameter(wv[i * d : (i + 1) * d], requires_grad=False)
                if bv is not None:
                    v.bias = nn.Parameter(bv[i * d : (i + 1) * d], requires_grad=False)
        return cls(wk, wv, bv, layers[0])

    def __call__(self, states: Tensor, kt: bool) -> list[tuple[Tensor, Tensor]]:
        """states [1, S, d] -> per layer (K [1, H, S, dh] or, kt, Kᵀ [1, H, dh, S]; V [1, H, S, dh]),
        all contiguous and fp32."""
        (B, S, d), H, split = states.shape, self.layer.heads, self.layer._split
        L = self.wk.shape[0] // d
        if B != 1:
            raise ValueError(f"joined cross K/V products take one row, not {B}")
        x = states.to(self.wk.dtype)  # bf16 rows, as `Bf16Linear` feeds them
        if kt:  # Kᵀ = W · statesᵀ: [L·d, d] × [1, d, S] -> [1, L·d, S], no transposing copy
            keys = torch.matmul(self.wk, x.transpose(1, 2)).float()
            ks = [keys[:, i * d : (i + 1) * d].view(B, H, d // H, S) for i in range(L)]
        else:
            keys = F.linear(x, self.wk).float()  # [1, S, L·d]
            ks = [split(keys[..., i * d : (i + 1) * d]).contiguous() for i in range(L)]
        values = F.linear(x, self.wv)  # [1, S, L·d] bf16; the fp32 bias joins as it leaves bf16
        vs = []
        for i in range(L):
            v = split(values[..., i * d : (i + 1) * d])  # [1, H, S, dh], strided
            out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
            if self.bv is not None:  # as `Bf16Linear` adds it: fp32, one pass
                torch.add(v, self.bv[i * d : (i + 1) * d].view(H, 1, d // H), out=out)
            else:
                out.copy_(v)
            vs.append(out)
        return list(zip(ks, vs))


CrossProducts.NONE = CrossProducts(torch.empty(0), torch.empty(0), None, None)


MOVE, NARROW, COPY = "move", "narrow", "copy"  # how `LeanRunner.keep` treats a layer's cross K/V


class LentCross(list):
    """Per layer one runner's cross K, V (views, `LeanRunner.plain_cross`), lent to another
    runner over the same rows. The two are kept together (`keep`, with the same rows): the
    lender moves the rows, and the borrower narrows its views of them."""


def _same_storage(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors are views of one storage."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


_LEAN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (head, its weight, LeanDecoder)


def lean_decoder(model, form: LayerForm | None = None) -> LeanDecoder:
    """The model's LeanDecoder, built once per model (its weights are frozen) and again when
    its head or head weight is replaced (`Whisper.use_head_form`, e.g. by
    `specasr.models.whisper.use_half_weights`) or another layer form is asked for. Kept
    beside the model, not on it: oneDNN's packed weight cannot be deep-copied."""
    cached = _LEAN.get(model)
    if (
        cached is None
        or cached[0] is not model.proj_out
        or cached[1] is not model.proj_out.weight
        or (form is not None and cached[2].form != form)
    ):
        cached = (model.proj_out, model.proj_out.weight, LeanDecoder(model, form=form))
        _LEAN[model] = cached
    return cached[2]


def decoder_form(model) -> LayerForm:
    """The layer form a model's runner runs (`specasr.runtime.forms`): a distilled draft's
    own (`DistilledDraft.form`), a CPU fp32 Whisper's `LeanDecoder` view's, else the reference
    layers of the model's own decoder."""
    own = getattr(model, "form", None)
    if isinstance(own, LayerForm):
        return own
    if LeanDecoder.supports(model):
        return lean_decoder(model).form
    return choose(model.model.decoder.layers)


# rows before a pass's scored ones from which its last layer computes only their keys and
# values (a window's first pass over a prompt): their outputs feed nothing but unread logits
SKIP_ROWS = 8


# the most tokens a one-row draft pass feeds through its fused C step (`specasr.backends.cpu.fused`),
# one call per token: the loop's feeds after a verify pass (1–2 tokens); a window's prompt
# (tens of tokens) runs faster as one torch pass
FUSED_TOKENS = 4


class LeanRunner:
    """One decoder's KV cache, preallocated for 448 positions, with the interface of
    `specasr.decode.runners.Runner` Protocol (call, rollback, keep, lengths): every row at
    its own length."""

    def __init__(
        self,
        decoder,
        states: Tensor,
        cross: list | None = None,
        form: LayerForm | None = None,
        lent: bool | None = None,
        mine: bool = False,
    ) -> None:
        """cross: per layer precomputed cross K, V [B, H, S, dh] for these states, or None to
        compute it. form: how the layers run (`specasr.runtime.forms`); None: the decoder's
        own (`LeanDecoder.form`), else chosen from its layers.

        Whose rows `keep` may move, where this runner reads given K/V in place (a layout that
        needs a copy makes the copy this runner's): lent, another runner's views
        (`plain_cross`) kept with this one over the same rows, which moves them (None: whether
        `cross` is a `LentCross`); mine, tensors no one else reads, moved here; neither, the
        caller's, left as they are (the first `keep` copies the rows it keeps)."""
        lent = isinstance(cross, LentCross) if lent is None else lent
        self.decoder = decoder
        self._states, self._rows = states, None  # [B0, S, d] as given; the kept rows of it (None: all)
        B = states.shape[0]
        self.lengths = [0] * B  # per row: positions the cache holds
        self._steps = None  # built on the first pass that needs them (`steps`)
        if form is None and isinstance(decoder, LeanDecoder):
            self._steps = decoder.steps
            form = decoder.form
        else:
            own = getattr(decoder, "form", None)  # a distilled draft's, chosen at its load
            form = form or (own if isinstance(own, LayerForm) else choose(decoder.layers))
        self.form = form
        # an int8 target's layers attend row-invariantly over a `fixed_mask` (`backends.cpu.invariant`)
        self.fixed = form.fixed_rows > 0
        cross = cross or [None] * len(decoder.layers)
        with torch.inference_mode():  # per layer K [B, H, S, dh] (fixed: Kᵀ [B, H, dh, S]), V [B, H, S, dh]
            if all(kv is None for kv in cross) and isinstance(decoder, LeanDecoder):
                self.cross = decoder.cross_kv(states, self.fixed)
            else:
                self.cross = [
                    layer.cross_kv(states, self.fixed) if kv is None else self._own(*kv)
                    for kv, layer in zip(cross, decoder.layers)
                ]
        # per layer, how `keep` treats its cross K/V: MOVE (this runner's), NARROW (a lender's), COPY
        self._cross_rows = [
            MOVE if kv is None or mine or not _same_storage(kv[0], own[0]) else NARROW if lent else COPY
            for kv, own in zip(cross, self.cross)
        ]
        shape = (B, decoder.heads, N_TEXT_CTX, decoder.d_model // decoder.heads)
        self.k = [states.new_zeros(shape) for _ in decoder.layers]
        self.v = [states.new_zeros(shape) for _ in decoder.layers]
        self._fused = self._bind_fused()

    @property
    def steps(self) -> tuple:
        """One step per layer in the runner's form, built by the first pass through the layers:
        a draft whose passes all run its fused C step never builds them, nor so the packed
        products they take (`Int8Linear.packed`, made on first use)."""
        if self._steps is None:
            self._steps = self.form.steps(self.decoder.layers)
        return self._steps

    def _bind_fused(self):
        """A draft's one-token step in C (`specasr.backends.cpu.fused`) bound to this runner's
        tensors, when it has one and one row; else None."""
        fused = getattr(self.decoder, "fused", None)
        if fused is None or self.k[0].shape[0] != 1:
            return None
        return fused.state(self.k, self.v, self.cross)

    @property
    def states(self) -> Tensor:
        """[B, S, d]: the encoder states of the rows kept."""
        return self._states if self._rows is None else self._states[self._rows]

    @property
    def vocab(self) -> list[int] | None:
        """A decoder with a reduced vocabulary (a distilled draft): the token each column of its
        `reduced=True` logits scores, ascending; None for a full-vocabulary decoder."""
        return getattr(self.decoder, "reduced_vocab", None)

    @property
    def columns(self) -> Tensor:
        """`vocab` as a tensor [N] on the decoder's device (a reduced-vocabulary decoder only)."""
        return self.decoder.vocab_ids

    @torch.inference_mode()
    def __call__(self, tokens: Tensor, last: int, reduced: bool = False) -> Tensor:
        """tokens [B, T], row b's at positions lengths[b] … lengths[b]+T-1 -> logits [B, last, V],
        or, reduced (only when `vocab` is not None), [B, last, N] over the columns `vocab`."""
        P, T = self.lengths, tokens.shape[1]
        if self._fused is not None and T <= FUSED_TOKENS and last == 1 and reduced:  # one row (B = 1)
            logits = self._fused.step(tokens[0].tolist(), P[0])  # [1, 1, N]
            self.lengths = [P[0] + T]
            return logits
        start, write = P[0], None
        if min(P) == max(P):  # rows alike (always at B = 1): one slice, one causal mask or none
            x = self.decoder.embed(tokens, start)
            mask = None
            if self.fixed:
                mask = fixed_mask(start + torch.arange(T, device=x.device).unsqueeze(0), N_TEXT_CTX)
            elif T > 1:
                mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(diagonal=start)
        else:
            start = max(P)
            x, mask, write = self._ragged(tokens, P)
            if self.fixed:
                mask = fixed_mask(write[:, 0, :, 0], N_TEXT_CTX)
        layers = list(zip(self.decoder.layers, self.steps, self.k, self.v, self.cross))
        with plain_calls():  # the layers and the head (an int8 one too)
            for _, step, K, V, (ck, cv) in layers[:-1]:
                x = step(x, ck, cv, mask, (K, V), start, write)
            layer, step, K, V, (ck, cv) = layers[-1]
            skip = T - last if write is None and T - last >= SKIP_ROWS else 0
            if skip:  # a prompt: the last layer keeps only its rows' keys and values
                layer.write_kv(x[:, :skip], K, V, start)
                x, mask = x[:, skip:], self._tail_mask(mask, T, skip)
            x = step(x, ck, cv, mask, (K, V), start + skip, write)
            self.lengths = [p + T for p in P]
            if reduced:
                return self.decoder.reduced_logits(x[:, -last:])
            return self.decoder.logits(x[:, -last:])

    def _own(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """A given cross K, V [B, H, S, dh] in this runner's layout, contiguous."""
        return (k.transpose(2, 3) if self.fixed else k).contiguous(), v.contiguous()

    def plain_cross(self) -> LentCross:
        """Per layer the cross K, V [B, H, S, dh] (views), for a draft that shares them and is
        kept with this runner (`keep` moves their rows in place)."""
        return LentCross((k.transpose(2, 3), v) if self.fixed else (k, v) for k, v in self.cross)

    def _tail_mask(self, mask: Tensor | None, T: int, skip: int) -> Tensor | None:
        """The uniform pass's mask for its query rows from `skip` on (keys unchanged)."""
        if self.fixed:  # [1, 1, T, N]: N from the greatest position, which the tail keeps
            return mask[:, :, skip:]
        n = T - skip
        return None if n == 1 else mask[skip:]  # [n, start+T]; one query row sees every key

    def _ragged(self, tokens: Tensor, P: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        """Rows at different lengths P: hidden [B, T, d] with each row's positions, the mask
        [B, 1, T, max P + T] (query i of row b sees keys 0 … P[b]+i) and the cache write
        index [B, H, T, dh] (row b's keys go to P[b] … P[b]+T-1)."""
        (B, T), dev, K = tokens.shape, tokens.device, self.k[0]
        pos = torch.tensor(P, device=dev)[:, None] + torch.arange(T, device=dev)  # [B, T]
        mask = torch.arange(max(P) + T, device=dev) <= pos[:, :, None]  # [B, T, max P + T]
        write = pos[:, None, :, None].expand(B, K.shape[1], T, K.shape[3])
        return self.decoder.embed(tokens, pos), mask[:, None], write

    def rollback(self, lengths: int | list[int]) -> None:
        """Forget every position from `lengths` on: one length for every row, or one per row."""
        if isinstance(lengths, int):
            lengths = [lengths] * len(self.lengths)
        self.lengths = [min(a, b) for a, b in zip(self.lengths, lengths)]

    @torch.inference_mode()  # the caches are inference tensors, moved in place
    def keep(self, rows: list[int] | Tensor) -> None:
        """Keep only these batch rows (finished rows stop consuming work). Rows in ascending
        order (the loop's) are compacted in place: each kept row that moves is copied down
        once, its self-attention cache only as far as it holds, and the tensors become views
        of their first rows. Any other order is gathered into new tensors."""
        rows = rows.tolist() if isinstance(rows, Tensor) else list(rows)
        self._rows = rows if self._rows is None else [self._rows[r] for r in rows]
        if all(a < b for a, b in zip(rows, rows[1:])):
            self._compact(rows)
        else:
            index = torch.tensor(rows, device=self.k[0].device)
            self.k = [k[index] for k in self.k]
            self.v = [v[index] for v in self.v]
            self.cross = [(k[index], v[index]) for k, v in self.cross]
            self._cross_rows = [MOVE] * len(self.cross)  # copies now: this runner's own
        self.lengths = [self.lengths[r] for r in rows]
        if len(rows) == 1:
            self._one_row_cross()
        self._fused = self._bind_fused()  # its tensors moved; one row left: the C step again

    def _one_row_cross(self) -> None:
        """One row left: its own cross K/V in the dtype the decoder's one-row runners keep them
        in (a distilled draft's `cross_dtype`, the bytes its C step reads), as a runner made for
        that row would hold them; a lender's stay as they are."""
        dtype = getattr(self.decoder, "cross_dtype", None)
        if dtype is None or self.cross[0][0].dtype == dtype or any(h != MOVE for h in self._cross_rows):
            return
        self.cross = [(k.to(dtype), v.to(dtype)) for k, v in self.cross]

    @torch.inference_mode()
    def reorder(self, rows: list[int]) -> None:
        """Row i takes row rows[i]'s self-attention cache and length (rows may repeat; one per
        row): a beam search's step, whose beams descend from beams of their own window. Rows of
        one window share their encoder states, so the cross K/V stay where they are. Only the
        rows that change are written, as far as their sources hold, from a copy of the sources
        (a row may be a source and a destination)."""
        if len(rows) != len(self.lengths):
            raise ValueError(f"reorder takes one source per row ({len(self.lengths)}), got {len(rows)}")
        moves = [(dst, src) for dst, src in enumerate(rows) if dst != src]
        if moves:
            device = self.k[0].device
            dst = torch.tensor([d for d, _ in moves], device=device)
            src = torch.tensor([s for _, s in moves], device=device)
            held = max(self.lengths[s] for _, s in moves)  # positions beyond hold nothing read
            for cache in self.k + self.v:  # [B, H, 448, dh]
                view = cache[:, :, :held]
                view.index_copy_(0, dst, view.index_select(0, src))
        self.lengths = [self.lengths[s] for s in rows]

    def _compact(self, rows: list[int]) -> None:
        """rows ascending: row rows[i] moves to i. Copying in ascending order never overwrites
        a row before it is read (i <= rows[i] < rows[j] for i < j)."""
        moves = [(dst, src) for dst, src in enumerate(rows) if dst != src]
        if moves:
            held = max(self.lengths[src] for _, src in moves)  # positions beyond hold nothing read
            for cache in self.k + self.v:  # [B, H, 448, dh]
                for dst, src in moves:
                    cache[dst, :, :held].copy_(cache[src, :, :held])
            for (k, v), how in zip(self.cross, self._cross_rows):
                if how == MOVE:  # a lender moves its own; the caller's are copied below
                    for t in (k, v):
                        for dst, src in moves:
                            t[dst].copy_(t[src])
        n = len(rows)
        self.k = [k[:n] for k in self.k]
        self.v = [v[:n] for v in self.v]
        index = torch.tensor(rows, device=self.k[0].device) if COPY in self._cross_rows else None
        self.cross = [
            (k[index], v[index]) if how == COPY else (k[:n], v[:n])
            for (k, v), how in zip(self.cross, self._cross_rows)
        ]
        self._cross_rows = [MOVE if how == COPY else how for how in self._cross_rows]

    def cache_prefix(self, row: int) -> list[Tensor]:
        """Per layer row `row`'s valid self-attention K and V [H, lengths[row], dh] (for tests)."""
        n = self.lengths[row]
        return [t[row, :, :n] for layer in zip(self.k, self.v) for t in layer]
