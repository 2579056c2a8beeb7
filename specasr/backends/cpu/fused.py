"""A distilled int8 draft's one-token step as one C call (`draft_step.cpp`), on CPU.

A draft step in the speculative loop is about 40 small torch ops: 13 fbgemm products, 4
attentions, norms, GELU, views. Each has a fixed cost of dispatch and set-up however small,
and more in the loop than hot, since the target's pass between draft steps leaves the draft's
code and data cold (docs/benchmarks.md has the timings). `FusedDraft` runs the whole step for
one row and one new token (what the loop asks for almost every time) as one call into a small
library built on first use by torch's own extension builder (`torch.utils.cpp_extension`, with
ninja) for the machine's own instructions (`-O3 -march=native -fopenmp`; AVX-512 VNNI where the
CPU has it) and cached beside the other compiled forms.

Its products are int8 like the torch path's (per-row weight scales, the input quantised per
call) but round differently, so its logits differ slightly from the torch path's: that moves
how often the target accepts a proposal, never the transcript, which the target decides.
Passes over several tokens or rows, and a machine without a C++ compiler, keep the torch path.
`SPECASR_FUSED_DRAFT=0` turns it off.

`LeanRunner` calls it (`specasr.runtime.runner`): the library reads and writes the runner's own
tensors (its self-attention cache at the token's position, its cross K/V), so the two paths
can alternate within one decode.

The same library computes an int8 target's head (`Int8Rows`, `int8_rows`): fbgemm's per-row
product, bitwise, from the int8 rows laid out in 16-row blocks, so a load does not pay for
fbgemm packing its own copy; and a bf16 encoder's self-attention (`bf16.Bf16Attention`,
`attend_bf16`). `SPECASR_FUSED_DRAFT=0` turns the library off for all three.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from importlib.resources import as_file, files
from pathlib import Path

import torch
from torch import Tensor

from specasr.backends.cpu.linear import Int8Linear
from specasr.backends.process import OPENMP_RUNTIME_FILE, openmp_runtimes
from specasr.cache import default_cache_root, store

SOURCE = "draft_step.cpp"
NAME = "specasr_draft_step"
MAX_THREADS = 8
# what the library's specasr_draft_abi() must return (SPECASR_DRAFT_ABI in draft_step.cpp): bumped
# on both sides together whenever a signature, `_Dims` or the pointers' order changes
ABI = 4
# cpp_extension adds only -fPIC, -std=c++20 and torch's include paths of its own: the tuning is
# these (-march=native: built per machine, keyed by the CPU's flags below). -ffp-contract=off:
# g++ would fuse a * b + c into FMAs where gcc in ISO C mode does not; off, the C++ build rounds
# as the C one did
CFLAGS = ["-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-fopenmp"]


class _Dims(ctypes.Structure):
    """`Dims` in draft_step.cpp, field for field; the library reports its sizeof, checked
    against this one's before anything is called."""

    _fields_ = [
        (name, ctypes.c_int32)
        for name in ("d", "heads", "ffn", "layers", "ctx", "threads", "head_rows", "embed_rows")
    ] + [("eps", ctypes.c_float)]


def enabled() -> bool:
    return os.environ.get("SPECASR_FUSED_DRAFT", "1") != "0"


def _warn(message: str) -> None:
    # once per process: `library()` is cached, so each cause warns at most once
    warnings.warn(f"the fused draft step is off (torch path instead): {message}", stacklevel=3)


def _torch_openmp() -> Path | None:
    """The OpenMP runtime torch loaded, to link the library against by path. A plain -fopenmp
    link names the compiler's libgomp.so.1: where torch bundles its own under another name
    (auditwheel's libgomp-<hash>.so.1 in torch.libs) that would load a second runtime beside
    torch's, with two thread pools competing for the cores. Linked to torch's file, the
    library's parallel regions run on the pool torch's own ops use."""
    root = Path(torch.__file__).resolve().parent
    mapped = [Path(p) for p in openmp_runtimes()]
    dirs = (root / "lib", root.parent / "torch.libs")
    for path in mapped:  # torch's own first, then whatever runtime torch's libraries pulled in
        if path.parent in dirs:
            return path
    if mapped:
        return mapped[0]
    found = [p for d in dirs for p in sorted(d.glob("lib*omp*.so*")) if OPENMP_RUNTIME_FILE.search(p.name)]
    return found[0] if found else None


def _ldflags(runtime: Path | None) -> list[str]:
    if runtime is None:  # torch without an OpenMP runtime in a file: the compiler's own
        return ["-fopenmp"]
    # -l:<file> links exactly that file (its soname goes into DT_NEEDED), and the rpath finds
    # it where torch has not loaded it first; no -fopenmp here, which would add -lgomp too
    return [f"-L{runtime.parent}", f"-l:{runtime.name}", f"-Wl,-rpath,{runtime.parent}"]


def _build(source: Path, path: Path, failed: Path, ldflags: list[str]) -> bool:
    """Builds `source` with torch.utils.cpp_extension into `path` whole (built in a directory
    of its own beside it, the library then renamed into place, the rest removed); False if it
    fails. A compiler's failure leaves `failed` (its message) and warns; a missing ninja only
    warns, as installing it fixes that."""
    from torch.utils import cpp_extension  # imports setuptools: only when building

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".build-") as tmp:
            try:
                cpp_extension.verify_ninja_availability()
            except RuntimeError as e:
                _warn(f"{e} (pip install ninja)")
                return False
            try:
                built = cpp_extension.load(
                    name=NAME,
                    sources=[str(source)],
                    extra_cflags=CFLAGS,
                    extra_ldflags=ldflags,
                    build_directory=tmp,
                    is_python_module=False,
                    verbose=False,
                )
            except (RuntimeError, subprocess.SubprocessError) as e:  # the compiler's or ninja's
                message = str(e)[-2000:]
                store(failed, message.encode())
                _warn(f"draft_step.cpp did not compile: {message[-400:]}")
                return False
            # the same inode the builder just loaded: opening `path` later finds it loaded
            os.replace(built, path)
    except OSError as e:  # the cache's disk, not the source: no note, a later process tries again
        _warn(f"the build did not finish: {e}")
        return False
    return True


def _cpu_key() -> str:
    """What `-march=native` compiles for: the CPU's model name and flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    keep = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(keep))  # each once (every core repeats them)


def _check(lib: ctypes.CDLL) -> str | None:
    """Why the library and this module disagree on how they talk, or None where they agree."""
    try:
        abi, size = lib.specasr_draft_abi, lib.specasr_draft_dims_size
    except AttributeError:
        return "the library exports no ABI version"
    abi.restype, size.restype = ctypes.c_int, ctypes.c_size_t
    if abi() != ABI:
        return f"the library's ABI is {abi()}, this module's {ABI}"
    if size() != ctypes.sizeof(_Dims):
        return f"the library's Dims is {size()} bytes, this module's {ctypes.sizeof(_Dims)}"
    return None


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled step, built once per source, compiler, CPU and torch (cached under
    `default_cache_root()/fused`), or None where there is no C++ compiler, it fails, or it
    disagrees with this module's ABI. A failed build warns once and leaves a `.failed` note
    with the compiler's message, so later processes do not try again (delete it, or install
    another compiler, to retry)."""
    cxx = shutil.which(os.environ.get("CXX", "c++"))  # what cpp_extension compiles with
    if cxx is None:
        return None
    runtime = _torch_openmp()
    ldflags = _ldflags(runtime)
    with as_file(files("specasr.backends.cpu").joinpath(SOURCE)) as source:
        text = source.read_bytes()
        # the compiler's path but not its version: asking costs every process a subprocess,
        # and a library built by an older compiler still runs
        parts = [text, cxx.encode(), _cpu_key().encode(), " ".join(CFLAGS + ldflags).encode()]
        parts.append(torch.__version__.encode())  # its libraries are linked in
        key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
        path = default_cache_root() / "fused" / f"draft_step-{key}.so"
        failed = path.with_suffix(".failed")
        if failed.exists():
            return None
        if not path.exists() and not _build(source, path, failed, ldflags):
            return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        _warn(f"{path} did not load: {e}")
        return None
    if why := _check(lib):
        _warn(why)
        return None
    vp = ctypes.c_void_p
    lib.draft_model.restype, lib.draft_state.restype = vp, vp
    lib.draft_model.argtypes = [ctypes.POINTER(_Dims), vp]
    lib.draft_state.argtypes = [vp, ctypes.c_int, ctypes.c_int, vp]
    lib.draft_step.argtypes = [vp, vp, ctypes.c_int, ctypes.c_int, vp]
    lib.draft_step.restype = ctypes.c_int
    lib.draft_free.argtypes = [vp]
    lib.specasr_draft_pointers.argtypes = [ctypes.c_int]
    lib.specasr_draft_pointers.restype = ctypes.c_int
    i = ctypes.c_int
    lib.int8_rows.argtypes = [vp, i, i, vp, vp, vp, i, vp, vp, vp, i]
    lib.int8_rows.restype = ctypes.c_int
    lib.attend_bf16_built.restype = ctypes.c_int
    lib.attend_bf16.argtypes = [vp, vp, vp, vp, i, i, i, i, i]
    lib.attend_bf16.restype = ctypes.c_int
    return lib


def _scales_and_sums(linear: Int8Linear) -> tuple[Tensor, Tensor]:
    """What the library reads beside a kept Int8Linear's int8 rows q [out, in]: their scales as
    fp32 [out] and their sums as int32 [out] (`Int8Linear.sums`, for the +128 shift of unsigned
    inputs)."""
    return linear.kept[1].float().contiguous(), linear.sums


class _Int8:
    """One product's tensors as the library reads them: W [out, in] int8, per-row scales and
    row sums, and the bias (or None), from an `Int8Linear` that kept its int8 rows."""

    def __init__(self, linear: Int8Linear) -> None:
        if linear.kept is None or linear.per_row:
            raise ValueError("the fused step reads a draft's Int8Linear built with keep=True")
        q, scale, bias = linear.kept
        self.w = q.contiguous()  # [out, in]
        self.scale, self.rsum = _scales_and_sums(linear)  # [out] each
        self.bias = None if bias is None else bias.contiguous()  # [out] fp32

    def pointers(self) -> list[int]:
        return [t.data_ptr() if t is not None else 0 for t in (self.w, self.scale, self.rsum, self.bias)]


class FusedDraft:
    """A draft's weights in the library's layout and its model handle. Build it after
    `DistilledDraft.quantize_int8` has made its products and head `Int8Linear`s that kept
    their int8 rows (`Int8Linear.kept_of`; the q, k, v products fused by
    `models.layers.fuse_qkv`): the library reads those rows, quantised once."""

    def __init__(self, draft, lib: ctypes.CDLL, threads: int | None = None) -> None:
        self.lib = lib
        self.vocab = len(draft.vocab_ids)
        self.keep: list = []  # every tensor the library points into
        shared = draft._shared

        def f32(t: Tensor) -> Tensor:
            t = t.detach().float().contiguous()
            self.keep.append(t)
            return t

        ptrs = [f32(shared["embed"]), f32(shared["positions"]), f32(draft.layer_norm.weight)]
        ptrs = [t.data_ptr() for t in ptrs] + [f32(draft.layer_norm.bias).data_ptr()]
        products = [_Int8(draft._head_int8)]
        ptrs += products[0].pointers()
        eps = {draft.layer_norm.eps}
        for layer in draft.layers:
            norms = (layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm)
            for norm in norms:
                ptrs += [f32(norm.weight).data_ptr(), f32(norm.bias).data_ptr()]
                eps.add(norm.eps)
            a, c = layer.self_attn, layer.encoder_attn
            for lin in (a.qkv_proj, a.out_proj, c.q_proj, c.out_proj, layer.fc1, layer.fc2):
                products.append(_Int8(lin))
                ptrs += products[-1].pointers()
        if len(eps) != 1:
            raise ValueError(f"the draft's layer norms differ in eps: {sorted(eps)}")
        self.keep += products
        self.ctx = shared["positions"].shape[0]
        # OpenMP threads per product, on torch's own runtime (`_torch_openmp`); capped, as a
        # one-token product is a short pass of memory reads that more threads split no further
        self.threads = threads or min(torch.get_num_threads(), MAX_THREADS)
        dims = _Dims(
            d=draft.d_model,
            heads=draft.heads,
            ffn=draft.ffn,
            layers=len(draft.layers),
            ctx=self.ctx,
            threads=self.threads,
            head_rows=self.vocab,
            embed_rows=shared["embed"].shape[0],
            eps=eps.pop(),
        )
        if len(ptrs) != lib.specasr_draft_pointers(len(draft.layers)):
            raise ValueError(f"{len(ptrs)} pointers for a draft the library reads otherwise")
        array = (ctypes.c_void_p * len(ptrs))(*ptrs)
        handle = lib.draft_model(ctypes.byref(dims), array)  # the library copies dims and pointers
        if not handle:
            raise ValueError(f"the fused step takes at most 8 layers, not {len(draft.layers)}")
        self.handle = ctypes.c_void_p(handle)
        self._free = lib.draft_free

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        if handle:
            self._free(handle)

    @classmethod
    def of(cls, draft) -> FusedDraft | None:
        """The fused step for this draft, or None where it cannot run (off, no compiler)."""
        if not enabled():
            return None
        lib = library()
        return None if lib is None else cls(draft, lib)

    def state(
        self, K: list[Tensor], V: list[Tensor], cross: list[tuple[Tensor, Tensor]]
    ) -> FusedState | None:
        """A runner's tensors (one row: self cache K, V [1, H, ctx, dh] fp32; cross K, V
        [1, H, S, dh] bf16 or fp32, contiguous) as the library's state, or None when they
        are laid out otherwise."""
        if K[0].shape[0] != 1 or K[0].shape[2] != self.ctx:
            return None
        ck = cross[0][0]
        dtype = ck.dtype
        if dtype not in (torch.float32, torch.bfloat16):
            return None
        tensors = [K, V, [k for k, _ in cross], [v for _, v in cross]]
        for group, want in zip(tensors, (torch.float32, torch.float32, dtype, dtype)):
            if any(t.dtype != want or not t.is_contiguous() or t.device.type != "cpu" for t in group):
                return None
        if any(k.shape != ck.shape or v.shape != ck.shape for k, v in cross):
            return None
        ptrs = [t.data_ptr() for layer in zip(*tensors) for t in layer]
        array = (ctypes.c_void_p * len(ptrs))(*ptrs)
        handle = self.lib.draft_state(self.handle, ck.shape[2], int(dtype == torch.bfloat16), array)
        return FusedState(self, handle, (K, V, cross)) if handle else None


class FusedState:
    """One runner's tensors bound to the library: `step(token, pos)` -> logits [1, 1, N]."""

    def __init__(self, model: FusedDraft, handle: int, tensors) -> None:
        self.model, self.handle, self.tensors = model, ctypes.c_void_p(handle), tensors
        self._step, self._free = model.lib.draft_step, model.lib.draft_free
        self._model = model.handle

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        if handle:
            self._free(handle)

    def step(self, tokens: list[int], pos: int) -> Tensor:
        """tokens at positions pos, pos+1, … -> the last one's logits [1, 1, N]: one call per
        token, the head only for the last."""
        out = torch.empty(1, 1, self.model.vocab)
        for i, token in enumerate(tokens):
            last = i == len(tokens) - 1
            code = self._step(self._model, self.handle, token, pos + i, out.data_ptr() if last else None)
            if code:
                why = {1: "position out of range", 2: "out of memory", 3: "token out of range"}.get(
                    code, code
                )
                raise RuntimeError(f"fused draft step failed ({why}) at position {pos + i}, token {token}")
        return out


class Int8Rows:
    """An int8 target's per-row product (`Int8Linear` with `per_row`) computed by the library
    from the int8 rows in 16-row blocks (`int8_rows` in draft_step.cpp): bitwise
    `scripted.int8_product(x, packed, None, True)`, built by one permutation of the rows where
    fbgemm's packing of a 51865-row head costs every load more. No bias: the head has none.
    x [rows, in] fp32 -> [rows, out]."""

    BLOCK = 16  # OUT_BLOCK in draft_step.cpp

    def __init__(self, linear: Int8Linear, lib: ctypes.CDLL) -> None:
        if linear.kept is None or not linear.per_row or linear.kept[2] is not None:
            raise ValueError("Int8Rows reads a per-row Int8Linear without bias built with keep=True")
        q, scale, _ = linear.kept
        self.lib = lib
        self.out_features, self.in_features = out, inputs = q.shape
        blocks = -(-out // self.BLOCK)
        pad = blocks * self.BLOCK - out
        padded = torch.cat([q, q.new_zeros(pad, inputs)]) if pad else q  # [blocks·16, in]
        # [blocks, in/4, 16, 4]: four inputs of 16 outputs side by side
        self.w = padded.view(blocks, self.BLOCK, inputs // 4, 4).transpose(1, 2).contiguous()
        scale, rsum = _scales_and_sums(linear)  # [out] each, then zeros for the padding rows
        self.scale = torch.cat([scale, scale.new_zeros(pad)])  # [blocks·16]
        self.rsum = torch.cat([rsum, rsum.new_zeros(pad)])  # [blocks·16]

    def state(self) -> dict[str, Tensor]:
        """Its tensors as `from_state` reads them (what `specasr.models.stored_int8` stores)."""
        shape = torch.tensor([self.out_features, self.in_features])
        return {"w": self.w, "scale": self.scale, "rsum": self.rsum, "shape": shape}

    @classmethod
    def from_state(cls, state: dict[str, Tensor]) -> Int8Rows | None:
        """The product `state()` gave, without quantising or permuting anything; None where the
        library cannot run, or the tensors are not of one such product."""
        out, inputs = (int(v) for v in state["shape"])
        blocks = -(-out // cls.BLOCK)
        w, scale, rsum = state["w"], state["scale"], state["rsum"]
        if not cls.runs(inputs) or w.shape != (blocks, inputs // 4, cls.BLOCK, 4) or w.dtype != torch.int8:
            return None
        if scale.shape != rsum.shape or scale.shape != (blocks * cls.BLOCK,):
            return None
        rows = cls.__new__(cls)
        rows.lib, rows.out_features, rows.in_features = library(), out, inputs
        rows.w, rows.scale, rows.rsum = w.contiguous(), scale.float().contiguous(), rsum.int().contiguous()
        return rows

    @staticmethod
    def runs(inputs: int) -> bool:
        """Whether the library can take products of `inputs` inputs here (on, built, and a
        multiple of 4): asked before quantising anything for it."""
        return inputs > 0 and inputs % 4 == 0 and enabled() and library() is not None

    @classmethod
    def of(cls, linear: Int8Linear) -> Int8Rows | None:
        """The library's product for `linear`, or None where it cannot run (`runs`)."""
        inputs = linear.kept[0].shape[1] if linear.kept is not None else 0
        return cls(linear, library()) if cls.runs(inputs) else None

    def __call__(self, x: Tensor) -> Tensor:
        x = x.float().contiguous()  # [rows, in]
        rows = x.shape[0]
        y = torch.empty(rows, self.out_features)  # [rows, out]
        scratch_u = torch.empty(rows, self.in_features, dtype=torch.uint8)  # each row on its u8 grid
        scratch_a = torch.empty(rows)  # each row's max |x|
        ptr = ctypes.c_void_p
        code = self.lib.int8_rows(
            ptr(x.data_ptr()), rows, self.in_features, ptr(self.w.data_ptr()), ptr(self.scale.data_ptr()),
            ptr(self.rsum.data_ptr()), self.out_features, ptr(y.data_ptr()), ptr(scratch_u.data_ptr()),
            ptr(scratch_a.data_ptr()), torch.get_num_threads(),
        )  # fmt: skip
        if code:
            raise ValueError(f"int8_rows takes no [{rows}, {self.in_features}] x [{self.out_features}, …]")
        return y


class Int8RowsLinear(torch.nn.Module):
    """y ≈ x Wᵀ + b through `Int8Rows`: W int8 per output row (±63), each row of x quantised on
    its own (per token). x [..., in] fp32 -> [..., out]."""

    def __init__(self, rows: Int8Rows, bias: Tensor | None) -> None:
        super().__init__()
        self.rows = rows
        self.bias = None if bias is None else bias.detach().float().contiguous()  # [out]
        self.in_features, self.out_features = rows.in_features, rows.out_features

    @classmethod
    def of(cls, linear: torch.nn.Module) -> Int8RowsLinear | None:
        """`linear` (weight [out, in], bias) as per-row int8 products, or None where the library
        cannot run (nothing quantised then)."""
        if not Int8Rows.runs(linear.weight.shape[1]):
            return None
        return cls(Int8Rows.of(Int8Linear(linear.weight, None, per_row=True, keep=True)), linear.bias)

    def state(self) -> dict[str, Tensor]:
        """Its tensors as `from_state` reads them."""
        return self.rows.state() | ({} if self.bias is None else {"bias": self.bias})

    @classmethod
    def from_state(cls, state: dict[str, Tensor]) -> Int8RowsLinear | None:
        rows = Int8Rows.from_state(state)
        return None if rows is None else cls(rows, state.get("bias"))

    def forward(self, x: Tensor) -> Tensor:
        y = self.rows(x.reshape(-1, x.shape[-1]))  # [rows, out]
        if self.bias is not None:
            y.add_(self.bias)
        return y.view(*x.shape[:-1], self.out_features)
