"""Process-wide tricks, owned in one place: each is named, says why it exists, and can be
switched off from the environment.

Every trick here changes how the process runs, never what it computes: with all of them off
a run produces the same output, only slower or with a larger footprint. They are listed in
`TRICKS` (name -> environment variable -> what it does); `python -m specasr.backends.process`
prints the table and whether each trick is on.

Switches: every trick is on by default. `SPECASR_<NAME>=0` (or false/no/off) turns one off,
e.g. `SPECASR_QUICK_EXIT=0`; `SPECASR_NO_TRICKS=1` turns them all off. The environment is read
when a trick is used, so a switch set before the call takes effect.

This module sits with the backends, low in the dependency order: it imports only the
standard library, and torch lazily (inside the tricks that need it), so `import specasr` and
the CLI's start-up stay free of torch.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import gc
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple


class Trick(NamedTuple):
    env: str  # the environment variable that switches it: "0" turns it off
    does: str  # what it does, in one line


TRICKS: dict[str, Trick] = {
    "lean_heap": Trick(
        "SPECASR_LEAN_HEAP",
        "CLI processes that run and exit (not `serve` or `app`): glibc's mmap threshold fixed at "
        "2 MB (mallopt), so large blocks go back on free; heap workspaces (the encoder's pass) "
        "lift it for their duration",
    ),
    "pause_gc": Trick(
        "SPECASR_PAUSE_GC",
        "Python's cyclic collector paused during imports and model loading",
    ),
    "freeze_gc": Trick(
        "SPECASR_FREEZE_GC",
        "a specasr command's first start-up moves what it made out of the collector's sight (gc.freeze)",
    ),
    "quick_exit": Trick(
        "SPECASR_QUICK_EXIT",
        "the specasr command ends through os._exit once atexit handlers ran and output is "
        "flushed, skipping the interpreter's teardown",
    ),
    "passive_when_busy": Trick(
        "SPECASR_PASSIVE_WHEN_BUSY",
        "a specasr command started while other processes keep the CPUs busy makes OpenMP's idle "
        "threads sleep (OMP_WAIT_POLICY=PASSIVE) instead of spinning; OMP_WAIT_POLICY or "
        "GOMP_SPINCOUNT set by the user win",
    ),
    "one_openmp_team": Trick(
        "SPECASR_ONE_OPENMP_TEAM",
        "a thread that has loaded models or transcribed hands its OpenMP "
        "team back when done (omp_pause_resource_all), and a server's request threads run their "
        "own torch work (features) on one thread: where more threads hold teams than there are "
        "CPUs, libgomp makes every team sleep between parallel regions instead of spinning",
    ),
    "one_thread_decoding": Trick(
        "SPECASR_ONE_THREAD_DECODING",
        "where OpenMP's threads wait passively (a command started on a busy machine, or "
        "OMP_WAIT_POLICY=passive), a one-row decoding loop runs on the calling thread alone: its "
        "many small parallel regions would each wait for a woken thread; batches and encoder "
        "passes keep every thread",
    ),
    "defer_torch_parts": Trick(
        "SPECASR_DEFER_TORCH_PARTS",
        "CLI processes that run and exit, on a CPU-only torch of a tested release: three parts of "
        "`import torch` that eager CPU inference never runs (torch.export, torch._native's GPU "
        "kernels, the Python meta kernels for tracing) load at their first use instead",
    ),
    "plain_calls": Trick(
        "SPECASR_PLAIN_CALLS",
        "decoder passes run with __torch_function__ subclass dispatch off "
        "(torch._C.DisableTorchFunctionSubclass)",
    ),
    "unoptimized_script": Trick(
        "SPECASR_UNOPTIMIZED_SCRIPT",
        "decoder passes run scripted layers without the TorchScript graph executor's "
        "profiling and optimisation (torch._C._set_graph_executor_optimize)",
    ),
}
ALL_OFF = "SPECASR_NO_TRICKS"  # "1" turns every trick off
_FALSE = frozenset({"0", "false", "no", "off"})


def enabled(name: str) -> bool:
    """Whether the trick `name` (a key of `TRICKS`) is on: it is unless `SPECASR_NO_TRICKS`
    is set (to anything but a false value) or its own variable is a false value."""
    trick = TRICKS[name]
    everything_off = os.environ.get(ALL_OFF, "").strip().lower()
    if everything_off and everything_off not in _FALSE:
        return False
    return os.environ.get(trick.env, "1").strip().lower() not in _FALSE


def describe() -> list[str]:
    """One line per trick: name, environment variable, on/off now, what it does."""
    return [
        f"{name:<19} {t.env:<27} {'on ' if enabled(name) else 'off'}  {t.does}" for name, t in TRICKS.items()
    ]


# -- the C heap (glibc malloc): `lean_heap` ------------------------------------------------
#
# glibc serves a large block (above its mmap threshold) from a mapping of its own, returned
# to the system on free, and everything else from the heap. By default the threshold grows
# to the largest block freed so far (up to 32 MB), so after loading, which frees many
# weight-sized tensors, temporaries stay resident in the heap and raise the peak RSS.
# `lean_heap` fixes the threshold for CLI processes; `heap_scope` lifts it for one many-row
# pass (`specasr.backends.cpu.heap.workspace`). Off glibc every call is a no-op.

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
LEAN_MMAP = 2 << 20  # bytes: the lean policy's threshold (logits of a step are under 2 MB)
TRIM_DEFAULT = 128 << 10  # bytes: glibc's default trim threshold

_heap_lock = threading.Lock()
_lean = False  # `lean_heap` was applied
_depth = 0  # open `heap_scope`s (threads of one process share the policy)


@functools.cache  # looked up once: every encoder pass enters and leaves a heap scope
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def _set(mmap_threshold: int, trim_threshold: int, fallback: int | None = None) -> None:
    """glibc's mmap and trim thresholds (mallopt); `fallback` for the mmap one where the
    build refuses the first value."""
    if (libc := _libc()) is not None:
        if not libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold) and fallback is not None:
            libc.mallopt(M_MMAP_THRESHOLD, fallback)
        libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)


def malloc_trim() -> None:
    """Returns the heap's free memory to the system (glibc's malloc_trim), e.g. after
    loading. A memory policy's step, not a switchable trick: it frees only what is free."""
    if (libc := _libc()) is not None:
        libc.malloc_trim(0)


def lean_heap() -> None:
    """The CLI's heap policy (trick `lean_heap`): blocks over 2 MB are mapped on their own
    and returned on free, while the decoder's per-step tensors stay in the heap. Without it
    the threshold grows after loading and temporaries stay resident. CLI processes only: a
    library user's process keeps its own policy. Applied once no `heap_scope` is open."""
    global _lean
    if not enabled("lean_heap"):
        return
    with _heap_lock:
        _lean = True
        if _depth == 0:
            _set(LEAN_MMAP, TRIM_DEFAULT)


def is_lean() -> bool:
    """Whether `lean_heap` set the policy in this process."""
    return _lean


@contextmanager
def heap_scope(mmap_threshold: int, trim_threshold: int, fallback: int | None = None) -> Iterator[None]:
    """The given thresholds instead of the lean policy's while inside, then the lean policy
    again and the free heap trimmed (`malloc_trim`). Nothing changes unless `lean_heap` set
    the policy. Nested and concurrent scopes share one heap mode: the first to enter sets
    it, the last to leave restores the lean policy."""
    global _depth
    if not _lean:
        yield
        return
    with _heap_lock:
        _depth += 1
        if _depth == 1:
            _set(mmap_threshold, trim_threshold, fallback)
    try:
        yield
    finally:
        with _heap_lock:
            _depth -= 1
            if _depth == 0:
                _set(LEAN_MMAP, TRIM_DEFAULT)
                malloc_trim()


# -- Python's cyclic collector: `pause_gc`, `freeze_gc` --------------------------------------


@contextmanager
def collector_paused(freeze: bool = False) -> Iterator[None]:
    """Python's cyclic collector off inside (trick `pause_gc`). Imports and model loading
    create about a million objects that live as long as the process (torch's modules, the
    models), and the collector's full passes over them find next to nothing (measured:
    docs/benchmarks.md, "Start-up"). On leaving, with `freeze` (and trick `freeze_gc` on),
    what exists is moved out of the collector's sight (`gc.freeze`: later passes skip it),
    then the collector resumes. Nothing when it was off already (nested scopes, a caller's
    own choice): a library caller's collector simply resumes, and one that was off stays off.
    Usable as a decorator."""
    paused = gc.isenabled() and enabled("pause_gc")
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            if freeze and enabled("freeze_gc"):
                gc.freeze()
            gc.enable()


_PROCESS = {"freeze": False}  # set by `claim_process`; the first `start_up` uses it up


def claim_process() -> None:
    """Marks this process as a `specasr` command's own (`specasr.cli.run`), so its first
    `start_up` freezes what start-up made: a test or an embedding caller keeps its collector
    as it was."""
    _PROCESS["freeze"] = True


def start_up():
    """Imports and model loading with Python's cyclic collector paused (`collector_paused`).
    In a `specasr` process (`claim_process`) the first one freezes what exists on leaving
    before the collector resumes; later loads in the same process (`specasr eval`, one model
    pair per mode) only pause it, so a finished mode's cyclic garbage is never frozen with
    them."""
    freeze, _PROCESS["freeze"] = _PROCESS["freeze"], False
    return collector_paused(freeze=freeze)


# -- OpenMP on a busy machine: `passive_when_busy` ----------------------------------------
#
# torch's OpenMP runtime (libgomp; the fused C draft step is linked to the same one) lets a
# thread that finished its share of a product spin for a while before it sleeps, which pays on
# an idle machine (the next product starts without a wake-up) and is ruinous on a busy one: the
# spinning threads take the cores from the thread every product waits for, and from the other
# processes. The runtime reads its policy once, when torch loads it, so the choice is made at
# the command's start, from the processes runnable at that moment (measured both ways:
# docs/benchmarks.md, "A busy machine").

BUSY_SAMPLES, BUSY_GAP = 5, 0.004  # reads of /proc/loadavg, seconds apart: a burst is not a hog


def runnable_others(samples: int = BUSY_SAMPLES, gap: float = BUSY_GAP) -> int:
    """Tasks that stay runnable on the machine besides this process: the least of a few reads
    of /proc/loadavg's running count (which counts this one), as a process that keeps a CPU
    busy is runnable at every read and a burst is not; 0 where it cannot be read. An idle
    machine answers at the first read."""
    import time

    least = None
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                others = int(f.read().split()[3].split("/")[0]) - 1
        except (OSError, ValueError, IndexError):
            return 0
        least = others if least is None else min(least, others)
        if least <= 0:
            return 0
        if i + 1 < samples:
            time.sleep(gap)
    return least or 0


def passive_when_busy(environ=os.environ) -> bool:
    """Sets OMP_WAIT_POLICY=PASSIVE in `environ` when other work keeps a CPU busy now (trick
    `passive_when_busy`), before torch is imported; True if it did. A policy the user set
    (OMP_WAIT_POLICY, GOMP_SPINCOUNT) stays, and so does an OpenMP runtime already loaded."""
    if not enabled("passive_when_busy") or "torch" in sys.modules:
        return False
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return False
    if runnable_others() < 1:
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


# -- OpenMP teams: `one_openmp_team` --------------------------------------------------------
#
# torch's CPU ops run their parallel regions on GNU OpenMP, which keeps a team of threads per
# thread that has started a region, alive as long as that thread. Once the threads held by all
# teams outnumber the CPUs, libgomp cuts every team's spinning between regions to almost
# nothing (its "throttled" spin count), so each region wakes its threads through the kernel: a
# decoding step, dozens of small regions, slows by half or more (measured: docs/benchmarks.md,
# "The server"). A server's engine thread beside the main thread that loaded the models is
# already one team too many on two CPUs. So the thread that loads hands its team back, so does
# a transcription when it ends (starting a team again costs a thread or two), and threads that only
# prepare work for another (a server's requests) keep their torch work on one thread, which
# starts no team. Other runtimes (Intel's, LLVM's) throttle otherwise: left alone.

# GNU's (libgomp.so.1, or auditwheel's libgomp-<hash>.so.1), Intel's and LLVM's
OPENMP_RUNTIME_FILE = re.compile(r"lib(?:gomp|iomp5|omp)(?:-\w+)?\.so(?:\.\d+)*$")
OMP_PAUSE_HARD = 2  # omp_pause_resource_t (OpenMP 5.0); libgomp frees the calling thread's team


def openmp_runtimes() -> list[str]:
    """The OpenMP runtime files this process has mapped (Linux; [] elsewhere), in load order."""
    try:
        with open("/proc/self/maps") as f:
            text = f.read()
    except OSError:
        return []
    paths = (line.split(maxsplit=5)[-1] for line in text.splitlines() if line.count(" ") >= 5)
    return list(dict.fromkeys(p for p in paths if OPENMP_RUNTIME_FILE.search(os.path.basename(p))))


def _gomp() -> ctypes.CDLL | None:
    """GNU OpenMP as torch loaded it, with the calls used here; None before torch is imported
    or without a GNU runtime. Looked up once torch is loaded: its runtime is the process's."""
    if "torch" not in sys.modules:
        return None
    return _torch_gomp()


@functools.cache
def _torch_gomp() -> ctypes.CDLL | None:
    torch_dir = os.path.dirname(os.path.realpath(sys.modules["torch"].__file__))
    own = (torch_dir + os.sep, os.path.join(os.path.dirname(torch_dir), "torch.libs") + os.sep)
    mapped = [p for p in openmp_runtimes() if "gomp" in os.path.basename(p)]
    # torch's own (torch/lib, or auditwheel's torch.libs) before any other library's
    mapped.sort(key=lambda p: not os.path.realpath(p).startswith(own))
    for path in mapped[:1]:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            return None
        if hasattr(lib, "omp_pause_resource_all") and hasattr(lib, "omp_set_num_threads"):
            lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
            lib.omp_set_num_threads.argtypes = [ctypes.c_int]
            return lib
    return None


def hand_back_team() -> bool:
    """The calling thread's OpenMP team goes (trick `one_openmp_team`): its threads exit, and
    the thread's next parallel region starts a new one. True if a team could be handed back."""
    lib = _gomp() if enabled("one_openmp_team") else None
    return lib is not None and lib.omp_pause_resource_all(OMP_PAUSE_HARD) == 0


def one_thread_here() -> bool:
    """torch's ops on the calling thread run on it alone, starting no OpenMP team (trick
    `one_openmp_team`), for a thread that prepares work another runs; other threads keep their
    count. True if set."""
    lib = _gomp() if enabled("one_openmp_team") else None
    if lib is None:
        return False
    import torch

    torch.get_num_threads()  # torch's per-thread set-up first: it would reset the count later
    lib.omp_set_num_threads(1)
    return True


def passive_waits(environ=os.environ) -> bool:
    """Whether OpenMP's idle threads sleep in this process: OMP_WAIT_POLICY=passive, as
    `passive_when_busy` sets it before torch loads (the runtime reads it once, at its load)."""
    return environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive"


@contextlib.contextmanager
def decoding_threads(rows: int) -> Iterator[None]:
    """A decoding loop's threads (trick `one_thread_decoding`): inside, torch's ops on the
    calling thread run on it alone when the loop decodes one row and OpenMP's waits are passive,
    and its count comes back after. Measured with passive waits, beside busy processes and
    quiet, a one-row loop ran faster on one thread than on two, and a batch of 8 rows slower
    (docs/performance.md, "A busy machine"); the C draft step follows the same count (`fused`).
    Nothing changes for batches, with spinning waits, the trick off, or no GNU runtime."""
    wanted = rows == 1 and enabled("one_thread_decoding") and passive_waits()
    lib = _gomp() if wanted else None
    if lib is None:
        yield
        return
    import torch

    before = torch.get_num_threads()  # (torch's per-thread set-up first, as in one_thread_here)
    lib.omp_set_num_threads(1)
    try:
        yield
    finally:
        lib.omp_set_num_threads(before)


# -- `import torch`: `defer_torch_parts` -------------------------------------------------
#
# `import torch` runs, besides what eager CPU inference uses, three packages that only tracing,
# export and GPU builds need: the Python meta kernels (`torch._meta_registrations`, with the
# decompositions and reference ops they pull in), `torch.export`, and `torch._native` (GPU kernels
# written in Triton and CuTe DSLs). Together they are about a quarter of the import on a CPU
# (measured: docs/benchmarks.md, "Start-up"). A command that runs and exits defers them: each is
# made a module that runs on the first access to one of its names, and all of them run before
# anything that traces is imported (`torch._dynamo`, `torch._inductor`, a `torch.export`
# submodule), so the meta kernels are in place wherever fake or meta tensors need them. On a torch
# built for a GPU nothing is deferred: there `torch._native` may replace kernels the run uses.

DEFERRED_TORCH_PARTS = (
    "torch._meta_registrations",
    "torch.distributed._meta_registrations",
    "torch._native",
    "torch.export",
)
# imported at the end of torch's import where `_set_generator_metaclass` is missing, as the deferred
# parts would have: sets torch.Generator's metaclass, without which no generator can be made
AFTER_TORCH = ("torch._prims.rng_prims",)


def _set_generator_metaclass() -> bool:
    """What of `AFTER_TORCH` eager work needs, without the rest: torch.Generator's metaclass, set
    as `torch._prims.rng_prims` sets it at its end. That module also builds torch's prims (112
    custom operators, about 0.06 s) and registers the generator for tracing; it runs with the
    deferred parts (`torch._meta_registrations` imports it), where setting the same metaclass
    again changes nothing. False where this torch has no such switch."""
    import torch

    set_meta = getattr(torch._C, "_set_generator_metaclass", None)
    try:
        from torch._opaque_base import OpaqueBaseMeta
    except ImportError:
        return False
    if set_meta is None:
        return False
    set_meta(OpaqueBaseMeta)
    return True


# importing one of these (or a submodule) first runs every deferred part
TRACING_ENTRY = ("torch._dynamo", "torch._inductor", "torch.export.", "torch._functorch.aot_autograd")


class _DeferredModule(types.ModuleType):
    """A deferred part of torch: its code runs on the first access to a name it does not have
    yet (the other parts stay deferred until their own use or a `TRACING_ENTRY` import)."""

    def __getattr__(self, name: str):
        _DeferringFinder.run_deferred(self)
        if isinstance(self, _DeferredModule):  # its loader failed to run it: no such name
            raise AttributeError(name)
        return getattr(self, name)


class _DeferredLoader(importlib.abc.Loader):
    """Wraps a part's own loader: creates the module, runs nothing until it is used."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return None  # the default module, made a `_DeferredModule` in exec_module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__class__ = _DeferredModule
        _DeferringFinder.pending.append((module, self.loader))


class _TorchLoader(importlib.abc.Loader):
    """Wraps torch's own loader: runs `import torch`, then sets the generator's metaclass (or,
    where that cannot be done alone, imports `AFTER_TORCH`)."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        if _set_generator_metaclass():
            return
        for name in AFTER_TORCH:
            try:
                importlib.import_module(name)
            except ImportError:  # a release without it: nothing of it was deferred either
                pass


class _DeferringFinder(importlib.abc.MetaPathFinder):
    """On sys.meta_path: hands out deferred specs for `DEFERRED_TORCH_PARTS` (and torch's own,
    which imports `AFTER_TORCH` when it is done), and runs the deferred parts before an import in
    `TRACING_ENTRY`."""

    pending: list[tuple[types.ModuleType, importlib.abc.Loader]] = []
    _lock = threading.RLock()

    def find_spec(self, name, path, target=None):
        if name.startswith(TRACING_ENTRY):
            self.run_deferred()
            return None
        if name != "torch" and name not in DEFERRED_TORCH_PARTS:
            return None
        if name == "torch" and not _defers_this_torch():  # its own import, and the finder leaves
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self)
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = (_TorchLoader if name == "torch" else _DeferredLoader)(spec.loader)
        return spec

    @classmethod
    def run_deferred(cls, only: types.ModuleType | None = None) -> None:
        """Runs the deferred parts' code (`only` that one's), in the order torch imported them."""
        with cls._lock:  # a part's code may import what runs the rest: each is taken off first
            while entry := next((p for p in cls.pending if only is None or p[0] is only), None):
                cls.pending.remove(entry)
                module, loader = entry
                module.__class__ = types.ModuleType
                loader.exec_module(module)


def _torch_built_for_a_gpu() -> bool:
    """Whether the installed torch carries CUDA, ROCm or XPU libraries (read from its files:
    torch is not imported yet); True where that cannot be told."""
    spec = importlib.machinery.PathFinder.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return True
    lib = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    try:
        names = os.listdir(lib)
    except OSError:
        return True
    return any(n.startswith(("libtorch_cuda", "libtorch_hip", "libtorch_xpu")) for n in names)


# the torch releases whose import this was written against and tested with: what `import torch`
# runs, and in which order, changes between releases
DEFERRING_TORCH = ("2.13.",)


def _torch_release() -> str:
    """The installed torch's version from its metadata (torch is not imported yet); "" if unknown."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def _defers_this_torch() -> bool:
    """Whether the installed torch is one whose parts are deferred: a CPU build of a release in
    `DEFERRING_TORCH`. Asked when torch's import starts, not at install: a command that never
    imports torch (a `--server` client) does not pay for reading the package metadata."""
    return not _torch_built_for_a_gpu() and _torch_release().startswith(DEFERRING_TORCH)


def defer_torch_parts() -> bool:
    """Installs the deferral of `DEFERRED_TORCH_PARTS` (trick `defer_torch_parts`) for a CLI
    process that runs and exits, before torch is imported; True if it did. Nothing once torch
    is loaded or when already installed. On a torch built for a GPU or a release not in
    `DEFERRING_TORCH` the finder, once torch's import starts, steps aside and defers nothing."""
    if not enabled("defer_torch_parts") or "torch" in sys.modules:
        return False
    if any(isinstance(f, _DeferringFinder) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _DeferringFinder())
    return True


# -- leaving the process: `quick_exit` -------------------------------------------------------


def quick_exit(code: int) -> None:
    """Ends the process with status `code` (trick `quick_exit`): the atexit handlers a normal
    exit would run (a temporary directory, logging, Ray) run once, stdout and stderr are
    flushed, and then os._exit. What that skips is the interpreter's teardown of torch and
    the models (destructors, freeing hundreds of MB), which a finished process does not need
    (measured: docs/benchmarks.md, "Start-up"). With the trick off, or on an interpreter
    without CPython's `atexit._run_exitfuncs`, it is `sys.exit(code)`. Never returns."""
    run_handlers = getattr(atexit, "_run_exitfuncs", None)  # CPython's; elsewhere exit as usual
    if run_handlers is None or not enabled("quick_exit"):
        sys.exit(code)
    run_handlers()  # the handlers a normal exit would run, once
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`) or stream: nothing to keep
            pass
    os._exit(code)


# -- private torch switches for decoder passes: `unoptimized_script`, `plain_calls` ---------


@functools.cache
def _torch_switches() -> tuple:
    """torch._C's graph-executor switch (get, set) and the subclass-dispatch guard, looked up
    once (every decoder pass enters them); None where this PyTorch lacks one."""
    import torch

    return (
        getattr(torch._C, "_get_graph_executor_optimize", None),
        getattr(torch._C, "_set_graph_executor_optimize", None),
        getattr(torch._C, "DisableTorchFunctionSubclass", None),
    )


@contextlib.contextmanager
def unoptimized_script() -> Iterator[None]:
    """Runs the scripted steps called inside without the JIT's graph optimisation (trick
    `unoptimized_script`; this thread only; the caller's setting is restored). The profiling
    executor runs every new input signature twice to profile it and then builds an optimised
    plan: the loop meets many (1–9 rows, ragged or not, each layer kind), and a fresh process
    paid for that in its first window for nothing: on CPU these graphs have no fusible
    pattern, and decoding runs at the same speed after warm-up either way (measured:
    docs/benchmarks.md, "Start-up"). The same ops run in the same order."""
    get_optimize, set_optimize, _ = _torch_switches()
    if get_optimize is None or set_optimize is None or not enabled("unoptimized_script"):
        yield  # a PyTorch without the switch, or the trick off: run as it runs
        return
    before = get_optimize()
    set_optimize(False)
    try:
        yield
    finally:
        set_optimize(before)


@contextlib.contextmanager
def plain_calls() -> Iterator[None]:
    """A decoder pass's calls from Python into scripted layers and int8 products, without the
    `__torch_function__` probe of every argument that is not a tensor (trick `plain_calls`;
    this thread).

    Each such call asks every argument for `__torch_function__`. A packed int8 product
    (`torch.classes.quantized.LinearPackedParamsBase`, six per `int8_layer_step` call and one
    per `linear.Int8Linear` call) answers by throwing a C++ exception that becomes a Python
    AttributeError and is caught, which costs far more than the call itself (measured:
    docs/benchmarks.md). The passes hold plain tensors only, so turning off subclass dispatch
    changes no op: the same ops run in the same order, on the same values. Also runs
    `unoptimized_script`."""
    with unoptimized_script():
        no_subclass_dispatch = _torch_switches()[2]
        if no_subclass_dispatch is None or not enabled("plain_calls"):
            yield  # a PyTorch without the switch, or the trick off: run as it runs
            return
        with no_subclass_dispatch():
            yield


if __name__ == "__main__":
    print("\n".join(describe()))
