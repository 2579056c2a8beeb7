"""Whisper's pre-norm decoder layer as plain torch, shared by the distilled draft and the
target's CPU view (`specasr.runtime.runner.LeanDecoder`). It is the reference: the faster
forms of a layer (`specasr.runtime.forms`) compute the same function and are tested against it.

The parameter names equal transformers' `WhisperDecoderLayer`, so a Hugging Face layer's
state dict loads as it is. The self-attention cache is preallocated and indexed by
position (`specasr.runtime.runner.LeanRunner`), so a rollback moves a length and recomputes
nothing. Rows of a batch may sit at different positions (ragged rows): their keys and
values are scattered to each row's own positions and a per-row mask hides the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specasr.backends.cpu.scripted import fixed_attend, fixed_self_attend, write_cache

_NO_INIT_LOCK = threading.Lock()
_no_init_depth = 0  # scopes open now, in any thread
_init_functions: dict = {}  # nn.init's own, while any scope is open


@contextmanager
def no_init():
    """Module constructors skip their random initialisation (as transformers' no_init_weights
    does): on meta tensors it would cost nothing, but torch routes it through its reference
    implementations, whose first use imports torch._dynamo (over a second). nn.init is
    process-wide: scopes open in several threads at once (a loader's pool) share one patch,
    taken by the first and restored by the last to leave, so no scope restores another's
    no-ops as nn.init's own."""
    global _no_init_depth
    names = ("normal_", "uniform_", "kaiming_uniform_", "ones_", "zeros_")
    with _NO_INIT_LOCK:
        if _no_init_depth == 0:
            _init_functions.update({n: getattr(nn.init, n) for n in names})
            for n in names:
                setattr(nn.init, n, lambda tensor, *args, **kwargs: tensor)
        _no_init_depth += 1
    try:
        yield
    finally:
        with _NO_INIT_LOCK:
            _no_init_depth -= 1
            if _no_init_depth == 0:
                for n, f in _init_functions.items():
                    setattr(nn.init, n, f)
                _init_functions.clear()


def embed(tokens_table: Tensor, positions_table: Tensor, tokens: Tensor, start: int | Tensor) -> Tensor:
    """Token plus position embeddings: tables [V, d] and [448, d], tokens [B, T] -> [B, T, d].
    start: the first position of every row (positions start … start+T-1), or per-row
    positions [B, T] (ragged rows)."""
    if isinstance(start, Tensor):
        return tokens_table[tokens] + positions_table[start]
    return tokens_table[tokens] + positions_table[start : start + tokens.shape[1]]


def by_window(
    project: Callable[[Tensor], list[tuple[Tensor, Tensor]]], states: Tensor
) -> list[tuple[Tensor, Tensor]]:
    """Cross K/V of encoder states [B, S, d] window by window: `project` maps one window's
    states [1, S, d] to per layer (K, V), each [1, …]; a batch's windows are projected alone and
    joined along the first dim. A window's [S, d] products and layout copies stay in cache,
    where a batch's [B·S, d] ones ran 1.5× slower a window (docs/benchmarks.md), and each
    window's K/V are bitwise those it gets alone."""
    if states.shape[0] == 1:
        return project(states)
    rows = [project(states[b : b + 1]) for b in range(states.shape[0])]
    return [
        (torch.cat([r[i][0] for r in rows]), torch.cat([r[i][1] for r in rows])) for i in range(len(rows[0]))
    ]


class Attention(nn.Module):
    """Whisper attention projections (names match transformers' WhisperAttention)."""

    def __init__(self, d: int, device=None) -> None:
        super().__init__()
        self.q_proj = nn.Linear(d, d, device=device)
        self.k_proj = nn.Linear(d, d, bias=False, device=device)
        self.v_proj = nn.Linear(d, d, device=device)
        self.out_proj = nn.Linear(d, d, device=device)


# a layer's modules, in the names of transformers' WhisperDecoderLayer
PARTS = (
    "self_attn",
    "encoder_attn",
    "self_attn_layer_norm",
    "encoder_attn_layer_norm",
    "final_layer_norm",
    "fc1",
    "fc2",
)


class DecoderLayer(nn.Module):
    """One pre-norm Whisper decoder layer, the reference every faster form of it
    (`specasr.runtime.forms`) is tested against; state_dict keys equal transformers'
    WhisperDecoderLayer."""

    def __init__(
        self, d: int, heads: int, ffn: int, device=None, parts: dict[str, nn.Module] | None = None
    ) -> None:
        """device: where to allocate the (uninitialised-to-be-loaded) weights; "meta" for none.
        parts: the layer's modules by name (`self_attn`, `encoder_attn`, the three norms,
        `fc1`, `fc2`), given instead of fresh ones: a view of another layer's weights in other
        product forms (`specasr.runtime.runner.LeanDecoder`)."""
        super().__init__()
        self.heads, self.dh = heads, d // heads
        if parts is not None:
            for name in PARTS:
                self.add_module(name, parts[name])
            return
        self.self_attn, self.encoder_attn = Attention(d, device), Attention(d, device)
        self.self_attn_layer_norm = nn.LayerNorm(d, device=device)
        self.encoder_attn_layer_norm = nn.LayerNorm(d, device=device)
        self.final_layer_norm = nn.LayerNorm(d, device=device)
        self.fc1, self.fc2 = nn.Linear(d, ffn, device=device), nn.Linear(ffn, d, device=device)

    def _split(self, x: Tensor) -> Tensor:  # [B, T, d] -> [B, H, T, dh]
        return x.view(x.shape[0], x.shape[1], self.heads, self.dh).transpose(1, 2)

    def cross_kv(self, states: Tensor, kt: bool = False) -> tuple[Tensor, Tensor]:
        """states [B, S, d] -> K, V [B, H, S, dh], contiguous: attention reads them every
        step, and a strided K/V would be copied by every call. kt: Kᵀ [B, H, dh, S] instead,
        what a cached pass of a layer with `fixed_rows` reads (`specasr.runtime.runner.LeanRunner`).
        A batch is projected window by window (`by_window`)."""
        if states.shape[0] > 1:
            return by_window(lambda x: [self.cross_kv(x, kt)], states)[0]
        a = self.encoder_attn
        v = self._split(a.v_proj(states)).contiguous()
        if kt and type(a.k_proj) is nn.Linear:  # Kᵀ = W · statesᵀ: one product, no transposing copy
            k = torch.matmul(a.k_proj.weight, states.transpose(1, 2))  # [B, d, S]
            if a.k_proj.bias is not None:  # Whisper's K has none; a loaded module might
                k.add_(a.k_proj.bias[:, None])
            return k.view(k.shape[0], self.heads, self.dh, k.shape[2]), v
        k = a.k_proj(states)  # [1, S, d]
        if kt:  # Kᵀ [1, H, dh, S] is [S, d] transposed: a 2-D transpose (a 4-D one copied 3× slower)
            return k[0].t().contiguous().view(1, self.heads, self.dh, k.shape[1]), v
        return self._split(k).contiguous(), v

    def write_kv(self, x: Tensor, K: Tensor, V: Tensor, start: int) -> None:
        """Only the self-attention keys and values of x [B, T, d] (rows alike, at positions
        start … start+T-1), written into the cache K, V [B, H, 448, dh]: what a layer keeps
        of rows whose own outputs nothing reads (`specasr.runtime.runner.LeanRunner`'s last layer
        over a prompt). The same products as `forward`'s, per row: an int8 target's rows
        are bitwise those a whole pass writes."""
        a = self.self_attn
        h = self.self_attn_layer_norm(x)
        if hasattr(a, "qkv_proj"):
            _, k, v = a.qkv_proj(h).chunk(3, dim=-1)
        else:
            k, v = a.k_proj(h), a.v_proj(h)
        write_cache(self._split(k), self._split(v), K, V, start, None)

    def forward(
        self,
        x: Tensor,  # [B, T, d] at positions start … start+T-1
        cross_k: Tensor,  # [B, H, S, dh]; with fixed_rows and a cache: Kᵀ [B, H, dh, S] (`cross_kv`)
        cross_v: Tensor,
        mask: Tensor | None,  # [T, start+T] or [B, 1, T, start+T] bool (True = attend); None: T == 1
        cache: tuple[Tensor, Tensor] | None = None,  # preallocated self-attention K, V [B, H, 448, dh]
        start: int = 0,
        write: Tensor | None = None,  # ragged rows: cache positions [B, H, T, dh] (a scatter index)
        fixed_rows: int = 0,  # > 0: an int8 target's row-invariant attention (`fixed_attend`)
    ) -> Tensor:
        """One layer. With a cache, this block's keys and values are written at positions
        start … start+T-1 and attention reads positions 0 … start+T-1; without one (teacher
        forcing from position 0) it attends over the block itself. Ragged rows: `write`
        holds each row's own positions, `start` is the greatest row start, and the mask
        [B, 1, T, start+T] hides every key past a query's own position."""
        T, scale = x.shape[1], self.dh**-0.5
        a = self.self_attn
        h = self.self_attn_layer_norm(x)  # once: it feeds q, k and v
        if hasattr(a, "qkv_proj"):  # fused (`fuse_qkv`): one product instead of three
            q, k, v = (self._split(t) for t in a.qkv_proj(h).chunk(3, dim=-1))
            q = q * scale
        else:
            q = self._split(a.q_proj(h) * scale)
            k, v = self._split(a.k_proj(h)), self._split(a.v_proj(h))
        fixed = cache is not None and fixed_rows > 0  # an int8 target; mask: `fixed_mask`
        if fixed:
            y = fixed_self_attend(q, k, v, *cache, mask, start, write, fixed_rows).view(x.shape)
        else:
            if cache is not None:
                K, V = cache
                write_cache(k, v, K, V, start, write)
                k, v = K[:, :, : start + T], V[:, :, : start + T]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
            y = y.transpose(1, 2).reshape(x.shape)
        x = x + a.out_proj(y)
        c = self.encoder_attn
        q = self._split(c.q_proj(self.encoder_attn_layer_norm(x)) * scale)
        if fixed:
            y = fixed_attend(q, cross_k, cross_v, None, fixed_rows, 0, True)  # cross_k: Kᵀ
        else:  # a draft's cross K/V may be bf16 (`DistilledDraft.cross_dtype`): q meets them there
            y = F.scaled_dot_product_attention(q.to(cross_k.dtype), cross_k, cross_v, scale=1.0).to(x.dtype)
        x = x + c.out_proj(y.transpose(1, 2).reshape(x.shape))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


def fuse_qkv(attn: nn.Module, make) -> None:
    """Replaces attn's q_proj, k_proj and v_proj by qkv_proj = make(nn.Linear d -> 3d) over
    [W_q; W_k; W_v] (k has no bias): three self-attention products as one. On CPU a 1-row
    product costs mostly its fixed call overhead, so one product three times as wide costs
    little more than one of the three (timings: docs/benchmarks.md). Each output row is the
    same dot product as before (int8: the same per-row scales, and one activation
    quantisation instead of three of the same input)."""
    q, k, v = attn.q_proj, attn.k_proj, attn.v_proj
    wq, wk, wv = q.weight, k.weight, v.weight  # a packed form's `weight` is a fresh dense copy
    with no_init():  # overwritten below; the bias's dtype is the products' (fp16-stored: fp32)
        fused = nn.Linear(wq.shape[1], 3 * wq.shape[0], device=wq.device, dtype=q.bias.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([wq, wk, wv]))
        fused.bias.copy_(torch.cat([q.bias, torch.zeros_like(q.bias), v.bias]))
    attn.qkv_proj = make(fused)
    del attn.q_proj, attn.k_proj, attn.v_proj
