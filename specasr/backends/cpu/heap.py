"""The process's memory policy, owned in one place: the C heap (glibc malloc) and, during
start-up, Python's cyclic collector.

glibc serves a large block (above its mmap threshold) from a mapping of its own, returned
to the system on free, and everything else from the heap. By default the threshold grows
to the largest block freed so far (up to 32 MB), so after loading, which frees many
weight-sized tensors, temporaries stay resident in the heap: tens of MB of peak RSS.

- `lean_heap()` (CLI processes only; a library user's process keeps its own policy) fixes
  the threshold at 2 MB: the decoder's per-step tensors stay in the heap, and every larger
  block is returned on free.
- `workspace()` lifts that for one many-row pass (the encoder over 1500 frames per window,
  where every product, norm and attention output is a 3–12 MB block). Under the lean
  policy each of those would be a fresh mapping, faulted in page by page: about 120 000
  page faults per window for base, 0.12–0.15 s of a 0.6 s pass (docs/benchmarks.md,
  "Start-up"). Inside, large blocks come from the heap and are reused from layer to layer;
  on leaving, the free heap goes back to the system (`trim`), so the peak is the pass's
  live set and nothing stays resident after it.
- `trim()` returns the heap's free memory (malloc_trim), e.g. after loading.

Off glibc every heap call is a no-op.

- `collector_paused()`: imports and model loading without Python's cyclic collector. They
  create about a million objects that live as long as the process (torch's modules, the
  models), and the collector's full passes over them find next to nothing: 0.25–0.3 s of a
  fresh `specasr transcribe` went to three or four of them (docs/benchmarks.md, "Start-up").
  With `freeze` (a `specasr` process only, `specasr.cli.common.start_up`) what exists on
  leaving is moved out of the collector's sight (`gc.freeze`) before it resumes; a library
  caller's collector simply resumes, and one that was off stays off.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
LEAN_MMAP = 2 << 20  # bytes: the lean policy's threshold (logits of a step are under 2 MB)
TRIM_DEFAULT = 128 << 10  # bytes: glibc's default trim threshold
# bytes, inside `workspace`: blocks up to 1 GB are heap-served (glibc builds that cap the
# threshold refuse it, and the documented 64-bit ceiling, 32 MB, is asked for instead), and
# the heap is not shrunk between layers. mallopt takes a C int: both stay under 2**31.
WORKSPACE_MMAP, WORKSPACE_MMAP_CAPPED = 1 << 30, 32 << 20
WORKSPACE_TRIM = 1 << 30

_lock = threading.Lock()
_lean = False  # `lean_heap` was applied
_depth = 0  # open `workspace` scopes (threads of one process share the policy)


@functools.cache  # looked up once: every encoder pass enters and leaves a workspace
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def _set(mmap_threshold: int, trim_threshold: int, fallback: int | None = None) -> None:
    if (libc := _libc()) is not None:
        if not libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold) and fallback is not None:
            libc.mallopt(M_MMAP_THRESHOLD, fallback)
        libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)


def lean_heap() -> None:
    """The CLI's policy: blocks over 2 MB are mapped on their own and returned on free."""
    global _lean
    with _lock:
        _lean = True
        if _depth == 0:
            _set(LEAN_MMAP, TRIM_DEFAULT)


def is_lean() -> bool:
    return _lean


def trim() -> None:
    """Returns the heap's free memory to the system (glibc's malloc_trim)."""
    if (libc := _libc()) is not None:
        libc.malloc_trim(0)


@contextmanager
def workspace() -> Iterator[None]:
    """Large temporaries from the heap while inside, trimmed on leaving (see the module's
    docstring). Nothing changes unless `lean_heap` set the policy. Nested and concurrent
    scopes share one heap mode: the last to leave restores the lean policy."""
    global _depth
    if not _lean:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            _set(WORKSPACE_MMAP, WORKSPACE_TRIM, WORKSPACE_MMAP_CAPPED)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _set(LEAN_MMAP, TRIM_DEFAULT)
                trim()


@contextmanager
def collector_paused(freeze: bool = False) -> Iterator[None]:
    """Python's cyclic collector off inside (see the module docstring); on leaving, with
    `freeze`, what exists is frozen (`gc.freeze`: later passes skip it), then the collector
    resumes. Nothing when it was off already (nested scopes, a caller's own choice)."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            if freeze:
                gc.freeze()
            gc.enable()
