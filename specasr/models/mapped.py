"""Tensors of a safetensors file, memory-mapped.

Whisper's token embedding (51865 × 512 for base, 106 MB in fp32) is also its tied output
head. On a CPU in fp32 the head runs from a oneDNN-packed copy (`specasr.backends.cpu.linear.PackedHead`),
so the embedding itself is only ever read a few rows at a time, by token lookups. Mapping it
from the conversion cache keeps just the looked-up pages resident instead of all 106 MB; the
packing reads it block by block, dropping each block's pages after it (`release`). The
loader maps the rest of the cache too (`map_file`): matrices it turns into other forms are
read in place, never copied first. Matrices that run once per window (the encoder's, the
cross-attention K/V projections) stay maps for good (`release_pages`): each call copies its
matrix out and drops the pages it read, so between windows they hold no resident memory.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


@dataclass(frozen=True)
class Span:
    """Where a tensor's bytes lie in its file."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # from the start of the file
    nbytes: int

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.shape[0]


def _header(path: str | Path) -> tuple[int, dict]:
    """(header length, header) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return n, json.loads(f.read(n))


def metadata(path: str | Path) -> dict[str, str]:
    """A safetensors file's `__metadata__`."""
    return _header(path)[1].get("__metadata__") or {}


def span(path: str | Path, name: str) -> Span | None:
    """The location of tensor `name` in a safetensors file, or None if it is absent or not
    a floating type this module handles."""
    n, header = _header(path)
    info = header.get(name)
    if info is None or info["dtype"] not in _DTYPES or not info["shape"]:
        return None
    start, end = info["data_offsets"]
    return Span(_DTYPES[info["dtype"]], tuple(info["shape"]), 8 + n + start, end - start)


_MAPS: dict[int, mmap.mmap] = {}  # the data pointer of each mapped tensor -> its map
_BASES: dict[int, int] = {}  # id of a `map_file` map -> the address of its first byte


def map_tensor(path: str | Path, where: Span) -> Tensor:
    """The tensor at `where` as a copy-on-write map of the file: pages are read on first
    touch and count as resident only once touched; writes (none are made) would stay private."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    count = where.nbytes // torch.empty((), dtype=where.dtype).element_size()
    flat = torch.frombuffer(mm, dtype=where.dtype, count=count, offset=where.offset)  # keeps mm alive
    _MAPS[flat.data_ptr()] = mm
    return flat.view(where.shape)


def map_file(
    path: str | Path, skip: set[str] | frozenset = frozenset(), only: set[str] | None = None
) -> dict[str, Tensor]:
    """Every floating tensor of a safetensors file but `skip` (only those in `only`, when given),
    as views of one copy-on-write map of the file (as `map_tensor`): no read and no copy; a
    page is resident once touched.
    A loader that turns most of them into other forms (packed, halved) then drops the map's
    pages with `release` on any one of them; the tensors it kept fault theirs back in from
    the page cache when used. A tensor of another dtype, or one the file is too short
    for -> ValueError."""
    n, header = _header(path)
    header.pop("__metadata__", None)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    out: dict[str, Tensor] = {}
    for name, info in header.items():
        if name in skip or (only is not None and name not in only):
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, not a floating type")
        dtype = _DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        count = (end - start) // torch.empty((), dtype=dtype).element_size()
        if 8 + n + end > len(mm):
            raise ValueError(f"{path}: tensor {name} is truncated")
        if count == 0:
            out[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        flat = torch.frombuffer(mm, dtype=dtype, count=count, offset=8 + n + start)  # keeps mm alive
        _MAPS[flat.data_ptr()] = mm
        _BASES[id(mm)] = flat.data_ptr() - (8 + n + start)
        out[name] = flat.view(info["shape"])
    return out


def own(module: torch.nn.Module, *maps: dict[str, Tensor]) -> None:
    """Replaces every tensor of `module` (parameters, buffers, tensor attributes) that is a
    view of one of `maps` (`map_file` results) by a private copy, and forgets the maps: once
    the caller drops them, they are unmapped. What a loader kept of a map (biases, norms,
    positions, the cross K/V matrices) is then ordinary memory, resident as its size says,
    not as the kernel's fault-around and the page cache's folio sizes decide."""
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for m in maps for t in m.values()]
    spans = [(a, b) for a, b in spans if b > a]

    def in_map(t: object) -> bool:
        if not isinstance(t, Tensor) or t.layout != torch.strided or t.is_mkldnn or t.numel() == 0:
            return False  # packed (opaque) forms are never views of a map
        return any(a <= t.data_ptr() < b for a, b in spans)

    with torch.no_grad():
        for sub in module.modules():
            for name, p in list(sub._parameters.items()):
                if in_map(p):
                    sub._parameters[name] = torch.nn.Parameter(p.detach().clone(), requires_grad=False)
            for name, b in list(sub._buffers.items()):
                if in_map(b):
                    sub._buffers[name] = b.clone()
            for name, t in list(vars(sub).items()):
                if in_map(t):
                    setattr(sub, name, t.detach().clone())
    for a, _ in spans:
        if (mm := _MAPS.pop(a, None)) is not None:
            _BASES.pop(id(mm), None)


def gather_rows(t: Tensor, ids: Tensor, chunk: int = 256) -> Tensor:
    """t[ids] for t [N, d] and ids [M]: -> [M, d]. For a mapped t, `chunk` ids at a time,
    releasing the pages after each, so gathering rows from all over the table never holds
    all of it resident."""
    if t.data_ptr() not in _MAPS:
        return t[ids]
    out = t.new_empty((ids.shape[0], *t.shape[1:]))
    for start in range(0, ids.shape[0], chunk):
        out[start : start + chunk] = t[ids[start : start + chunk]]
        release(t)
    return out


def release_pages(t: Tensor) -> bool:
    """Drops the resident pages that lie wholly inside a `map_file` tensor's own bytes, and no
    others of its map: what a form that reads its matrix once per window (`MappedLinear`) read.
    Later reads fault them back in from the page cache. False (and nothing done) for other
    tensors."""
    mm = _MAPS.get(t.data_ptr())
    if mm is None or id(mm) not in _BASES or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    start = t.data_ptr() - _BASES[id(mm)]  # in the map
    page = mmap.PAGESIZE
    first, end = -(-start // page) * page, (start + t.numel() * t.element_size()) // page * page
    if end > first:  # the partial pages at either end stay: they hold a neighbour's bytes too
        mm.madvise(mmap.MADV_DONTNEED, first, end - first)
    return True


def release(t: Tensor) -> bool:
    """Drops the resident pages of a mapped tensor (`map_tensor`) from this process, e.g.
    after a pass that read all of it; later reads fault them back in from the page cache.
    Safe because the map is never written. False (and nothing done) for other tensors."""
    mm = _MAPS.get(t.data_ptr())
    if mm is None or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    mm.madvise(mmap.MADV_DONTNEED)
    return True
