"""A distilled int8 draft's one-token step as one C call (`draft_step.c`), on CPU.

A draft step in the speculative loop is about 40 small torch ops: 13 fbgemm products, 4
attentions, norms, GELU, views. Each costs a fixed 10–45 µs of dispatch and set-up however
small, and more in the loop than hot, since the target's pass between draft steps leaves the
draft's code and data cold (docs/benchmarks.md). `FusedDraft` runs the whole step for one row
and one new token (what the loop asks for almost every time) as one call into a small C
library compiled on first use with the machine's own instructions (`gcc -O3 -march=native
-fopenmp`; AVX-512 VNNI where the CPU has it) and cached beside the other compiled forms.

Its products are int8 like the torch path's (per-row weight scales, the input quantised per
call) but round differently, so its logits differ slightly from the torch path's: that moves
how often the target accepts a proposal, never the transcript, which the target decides.
Passes over several tokens or rows, and a machine without a C compiler, keep the torch path.
`SPECASR_FUSED_DRAFT=0` turns it off.

`LeanRunner` calls it (`specasr.runtime.runner`): the library reads and writes the runner's own
tensors (its self-attention cache at the token's position, its cross K/V), so the two paths
can alternate within one decode.
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
from importlib.resources import files
from pathlib import Path

import torch
from torch import Tensor

from specasr.backends.cpu.linear import Int8Linear
from specasr.cache import default_cache_root, store

SOURCE = "draft_step.c"
MAX_THREADS = 8
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC", "-std=c11"]


def enabled() -> bool:
    return os.environ.get("SPECASR_FUSED_DRAFT", "1") != "0"


def _build(cc: str, source: bytes, path: Path, failed: Path) -> bool:
    """Compiles `source` into `path` whole (built beside it, then renamed); False if it fails."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            src, out = Path(tmp) / SOURCE, Path(tmp) / "draft_step.so"
            src.write_bytes(source)
            done = subprocess.run(
                [cc, *FLAGS, str(src), "-o", str(out), "-lm"], capture_output=True, timeout=120
            )
            if done.returncode != 0:
                message = done.stderr.decode(errors="replace")[-2000:]
                store(failed, message.encode())
                warnings.warn(
                    f"the fused draft step did not compile (torch path instead): {message[-400:]}",
                    stacklevel=3,
                )
                return False
            os.replace(out, path)
    except (OSError, subprocess.SubprocessError):
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


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled step, built once per source, compiler and CPU (cached under
    `default_cache_root()/fused`), or None where there is no C compiler or it fails. A
    failed build warns once and leaves a `.failed` note with the compiler's message, so
    later processes do not try again (delete it, or install another compiler, to retry)."""
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        return None
    source = files("specasr.backends.cpu").joinpath(SOURCE).read_bytes()
    # the compiler's path but not its version: asking costs every process a subprocess, and
    # a library built by an older compiler still runs
    parts = [source, cc.encode(), _cpu_key().encode(), " ".join(FLAGS).encode()]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    path = default_cache_root() / "fused" / f"draft_step-{key}.so"
    failed = path.with_suffix(".failed")
    if failed.exists():
        return None
    if not path.exists() and not _build(cc, source, path, failed):
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return None
    vp = ctypes.c_void_p
    lib.draft_model.restype, lib.draft_state.restype = vp, vp
    lib.draft_model.argtypes = [vp, vp, vp]
    lib.draft_state.argtypes = [vp, ctypes.c_int, ctypes.c_int, vp]
    lib.draft_step.argtypes = [vp, vp, ctypes.c_int, ctypes.c_int, vp]
    lib.draft_step.restype = ctypes.c_int
    lib.draft_free.argtypes = [vp]
    return lib


class _Int8:
    """One product's tensors as the library reads them: W [out, in] int8, per-row scales and
    row sums, and the bias (or None), from an `Int8Linear` that kept its int8 rows."""

    def __init__(self, linear: Int8Linear) -> None:
        if linear.kept is None or linear.per_row:
            raise ValueError("the fused step reads a draft's Int8Linear built with keep=True")
        q, scale, bias = linear.kept
        self.w = q.contiguous()  # [out, in]
        self.scale = scale.float().contiguous()  # [out]
        self.rsum = q.sum(dim=1, dtype=torch.int32).contiguous()  # [out]
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
        # OpenMP threads per product (torch's own runtime: the library links the libgomp torch
        # loaded); capped, as a one-token product is a few hundred µs of memory reads
        self.threads = threads or min(torch.get_num_threads(), MAX_THREADS)
        embed_rows = shared["embed"].shape[0]
        dims = (ctypes.c_int32 * 8)(
            draft.d_model,
            draft.heads,
            draft.ffn,
            len(draft.layers),
            self.ctx,
            self.threads,
            self.vocab,
            embed_rows,
        )
        array = (ctypes.c_void_p * len(ptrs))(*ptrs)
        eps_value = ctypes.c_float(eps.pop())  # the library copies dims, eps and the pointers
        handle = lib.draft_model(ctypes.cast(dims, ctypes.c_void_p), ctypes.byref(eps_value), array)
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
