"""The process-wide tricks (`specasr.backends.process`): each is on by default, and its switch
(`SPECASR_<NAME>=0`, or `SPECASR_NO_TRICKS=1` for all) makes it a no-op."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from specasr.backends import process
from specasr.backends.cpu import heap


@pytest.fixture(autouse=True)
def default_switches(monkeypatch):
    """Every test starts with no switch set."""
    monkeypatch.delenv(process.ALL_OFF, raising=False)
    for trick in process.TRICKS.values():
        monkeypatch.delenv(trick.env, raising=False)


def _env(**switches: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECASR_")}
    return {**env, **switches}


def test_every_trick_is_listed_with_its_switch_and_on_by_default():
    assert set(process.TRICKS) == {
        "lean_heap", "pause_gc", "freeze_gc", "quick_exit", "passive_when_busy", "defer_torch_parts",
        "plain_calls", "unoptimized_script", "one_openmp_team", "one_thread_decoding",
    }  # fmt: skip
    for name, trick in process.TRICKS.items():
        assert trick.env == f"SPECASR_{name.upper()}" and trick.does
        assert process.enabled(name)
    lines = process.describe()
    assert len(lines) == len(process.TRICKS) and all(" on " in line for line in lines)


@pytest.mark.parametrize("value", ["0", "false", "No", "off"])
def test_a_trick_is_switched_off_by_its_own_variable_only(monkeypatch, value):
    monkeypatch.setenv("SPECASR_QUICK_EXIT", value)
    assert not process.enabled("quick_exit")
    assert all(process.enabled(name) for name in process.TRICKS if name != "quick_exit")


def test_no_tricks_switches_every_trick_off(monkeypatch):
    monkeypatch.setenv(process.ALL_OFF, "1")
    assert not any(process.enabled(name) for name in process.TRICKS)
    monkeypatch.setenv(process.ALL_OFF, "0")
    assert all(process.enabled(name) for name in process.TRICKS)


def test_the_module_lists_the_tricks():
    out = subprocess.run(
        [sys.executable, "-m", "specasr.backends.process"],
        capture_output=True, text=True, check=True, env=_env(SPECASR_PAUSE_GC="0"),
    ).stdout  # fmt: skip
    rows = {line.split()[0]: line.split()[2] for line in out.splitlines()}
    assert rows == {name: ("off" if name == "pause_gc" else "on") for name in process.TRICKS}


# -- lean_heap -----------------------------------------------------------------------------


@pytest.fixture()
def mallopt(heap_calls):
    return heap_calls


def test_lean_heap_sets_the_threshold_by_default(mallopt):
    process.lean_heap()
    assert mallopt == [("set", process.LEAN_MMAP, process.TRIM_DEFAULT)] and process.is_lean()


@pytest.mark.parametrize("switch", ["SPECASR_LEAN_HEAP", "SPECASR_NO_TRICKS"])
def test_lean_heap_off_calls_no_mallopt_and_leaves_workspaces_inert(mallopt, monkeypatch, switch):
    monkeypatch.setenv(switch, "0" if switch == "SPECASR_LEAN_HEAP" else "1")
    process.lean_heap()
    with heap.workspace():
        pass
    assert mallopt == [] and not process.is_lean()


@pytest.mark.parametrize(("command", "lean"), [("transcribe", True), ("serve", False), ("app", False)])
def test_only_commands_that_run_and_exit_take_the_lean_heap(monkeypatch, command, lean):
    """A server (`serve`, the app) keeps glibc's heap policy, so its temporaries are reused
    from request to request; a one-shot command returns large blocks on free."""
    from click.testing import CliRunner

    from specasr.cli import main

    calls = []
    monkeypatch.setattr(process, "lean_heap", lambda: calls.append(1))
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert calls == ([1] if lean else [])


# -- defer_torch_parts ---------------------------------------------------------------------

# a fresh interpreter: the trick, then torch; what was deferred, and eager CPU work
_DEFERRED = """
import json, sys
from specasr.backends import process
installed = process.defer_torch_parts()
import torch
parts = {m: type(sys.modules[m]).__name__ for m in process.DEFERRED_TORCH_PARTS if m in sys.modules}
g = torch.Generator().manual_seed(0)  # needs the generator's metaclass, set after torch's import
prims = "torch._prims" in sys.modules  # built by the deferred parts, not for eager work
lin = torch.nn.Linear(4, 3)
y = lin(torch.randn(2, 4, generator=g)).softmax(-1)
traced = None
if sys.argv[1] == "export":  # tracing needs the meta kernels: every deferred part runs first
    exported = torch.export.export(lin, (torch.randn(2, 4),))
    traced = exported.module()(torch.ones(2, 4)).shape == (2, 3)
    parts = {m: type(sys.modules[m]).__name__ for m in parts}
    from torch._library.opaque_object import is_opaque_type
    prims = "torch._prims" in sys.modules and is_opaque_type(torch.Generator)  # as torch's own import
if sys.argv[1] == "dtensor":  # as transformers imports it: reaches torch.export's submodules
    import torch.distributed.tensor
    parts = {m: type(sys.modules[m]).__name__ for m in parts}
out = {"installed": installed, "parts": parts, "rows": y.sum(-1).tolist(), "traced": traced, "prims": prims}
print(json.dumps(out))
"""


def _deferred_run(what: str, **switches: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _DEFERRED, what], capture_output=True, text=True, env=_env(**switches)
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_defer_torch_parts_leaves_them_unrun_until_tracing_needs_them():
    if not process._defers_this_torch():  # a GPU build, another release: torch's own import
        assert set(_deferred_run("eager")["parts"].values()) == {"module"}
        return
    eager = _deferred_run("eager")
    assert eager["installed"] and eager["rows"] == pytest.approx([1.0, 1.0])
    assert set(eager["parts"]) >= {"torch._meta_registrations", "torch._native", "torch.export"}
    assert set(eager["parts"].values()) == {"_DeferredModule"}
    assert eager["prims"] is False  # the metaclass alone was set, not torch's prims built
    traced = _deferred_run("export")
    assert traced["traced"] is True and set(traced["parts"].values()) == {"module"}
    assert traced["prims"] is True  # the deferred parts built them and registered the generator
    assert set(_deferred_run("dtensor")["parts"].values()) == {"module"}


def test_defer_torch_parts_off_or_after_torch_changes_nothing(monkeypatch):
    off = _deferred_run("eager", SPECASR_DEFER_TORCH_PARTS="0")
    assert not off["installed"] and set(off["parts"].values()) == {"module"}
    assert not process.defer_torch_parts()  # torch is loaded in this process
    assert not any(isinstance(f, process._DeferringFinder) for f in sys.meta_path)


_OTHER_RELEASE = """
import sys
from specasr.backends import process
process._torch_release = lambda: sys.argv[1]
installed = process.defer_torch_parts()
import torch
kinds = {type(sys.modules[m]).__name__ for m in process.DEFERRED_TORCH_PARTS if m in sys.modules}
finder = any(isinstance(f, process._DeferringFinder) for f in sys.meta_path)
print(installed, sorted(kinds), finder)
"""


def test_a_torch_release_it_was_not_written_for_keeps_its_own_import():
    """The release is asked when torch's import starts (this process has torch loaded, so a
    fresh interpreter's import is watched): another release runs every part at once, and the
    finder leaves."""
    for release in ("2.4.1", ""):
        out = subprocess.run(
            [sys.executable, "-c", _OTHER_RELEASE, release], capture_output=True, text=True, env=_env()
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["True", "['module']", "False"], out.stdout
    assert process._torch_release().startswith(torch.__version__.split("+")[0])  # this process's torch


def test_deferring_reads_no_package_metadata_until_torch_is_imported():
    """A command that never imports torch (a `--server` client) does not pay for the lookup."""
    code = (
        "import sys; from specasr.backends import process; "
        "print(process.defer_torch_parts(), 'importlib.metadata' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    assert out.stdout.split() == ["True", "False"], out.stderr[-1000:]


def test_a_torch_built_for_a_gpu_is_told_by_its_libraries(monkeypatch, tmp_path):
    import importlib.machinery

    (tmp_path / "torch" / "lib").mkdir(parents=True)

    def spec(name, path=None):
        found = importlib.machinery.ModuleSpec("torch", None, is_package=True)
        found.submodule_search_locations = [str(tmp_path / "torch")]
        return found if name == "torch" else None

    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", staticmethod(spec))
    assert not process._torch_built_for_a_gpu()
    (tmp_path / "torch" / "lib" / "libtorch_cuda.so").touch()
    assert process._torch_built_for_a_gpu()


@pytest.mark.parametrize(("command", "deferred"), [("transcribe", True), ("serve", False), ("app", False)])
def test_only_commands_that_run_and_exit_defer_torch_parts(monkeypatch, command, deferred):
    from click.testing import CliRunner

    from specasr.cli import main

    calls = []
    monkeypatch.setattr(process, "defer_torch_parts", lambda: calls.append(1))
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert calls == ([1] if deferred else [])


# -- pause_gc, freeze_gc ---------------------------------------------------------------------

_COLLECTOR = """
import gc, json
from specasr.backends import process
frozen = gc.get_freeze_count()
with process.collector_paused(freeze=True):
    inside = gc.isenabled()
    made = [[i] for i in range(1000)]  # containers the collector tracks
print(json.dumps({"inside": inside, "after": gc.isenabled(),
                  "frozen": gc.get_freeze_count() - frozen >= 1000}))
"""


@pytest.mark.parametrize(
    ("switches", "expect"),
    [
        ({}, {"inside": False, "after": True, "frozen": True}),
        ({"SPECASR_FREEZE_GC": "0"}, {"inside": False, "after": True, "frozen": False}),
        ({"SPECASR_PAUSE_GC": "0"}, {"inside": True, "after": True, "frozen": False}),
        ({"SPECASR_NO_TRICKS": "1"}, {"inside": True, "after": True, "frozen": False}),
    ],
)
def test_collector_switches(switches, expect):
    """In a fresh process (a freeze would outlive the test)."""
    out = subprocess.run(
        [sys.executable, "-c", _COLLECTOR], capture_output=True, text=True, check=True, env=_env(**switches)
    ).stdout
    assert json.loads(out) == expect


def test_pause_gc_off_leaves_the_collector_running_here(monkeypatch):
    assert gc.isenabled()
    monkeypatch.setenv("SPECASR_PAUSE_GC", "0")
    with process.collector_paused():
        assert gc.isenabled()
    monkeypatch.delenv("SPECASR_PAUSE_GC")
    with process.collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


# -- quick_exit ------------------------------------------------------------------------------

_EXIT = """
import atexit, sys
import click
from specasr import cli

@cli.main.command("probe")
def probe():
    atexit.register(lambda: print("atexit ran", file=sys.stderr))
    sys.stdout.write("written, ")
    sys.exit(3)

sys.argv = ["specasr", "probe"]
try:
    cli.run()
except SystemExit as e:  # only without the quick exit: os._exit never raises
    sys.stdout.write(f"through sys.exit({e.code})")
    raise
"""


@pytest.mark.parametrize(
    ("switches", "through_sys_exit"),
    [({}, False), ({"SPECASR_QUICK_EXIT": "0"}, True), ({"SPECASR_NO_TRICKS": "1"}, True)],
)
def test_quick_exit_switch(switches, through_sys_exit):
    child = subprocess.run(
        [sys.executable, "-c", _EXIT], capture_output=True, text=True, timeout=120, env=_env(**switches)
    )
    assert child.returncode == 3, child.stderr
    assert "atexit ran" in child.stderr
    want = "written, through sys.exit(3)" if through_sys_exit else "written, "
    assert child.stdout == want


# -- plain_calls, unoptimized_script ---------------------------------------------------------


def test_plain_calls_turns_off_subclass_dispatch_and_the_jit_optimisation_by_default():
    with torch.jit.optimized_execution(True):
        with process.plain_calls():
            assert not torch._C._is_torch_function_enabled()
            assert torch._C._get_graph_executor_optimize() is False
        assert torch._C._is_torch_function_enabled()
        assert torch._C._get_graph_executor_optimize() is True


def test_plain_calls_off_keeps_subclass_dispatch(monkeypatch):
    monkeypatch.setenv("SPECASR_PLAIN_CALLS", "0")
    with torch.jit.optimized_execution(True), process.plain_calls():
        assert torch._C._is_torch_function_enabled()
        assert torch._C._get_graph_executor_optimize() is False  # its own switch still on


def test_unoptimized_script_off_keeps_the_jit_optimisation(monkeypatch):
    monkeypatch.setenv("SPECASR_UNOPTIMIZED_SCRIPT", "0")
    with torch.jit.optimized_execution(True), process.plain_calls():
        assert torch._C._get_graph_executor_optimize() is True
        assert not torch._C._is_torch_function_enabled()


def test_no_tricks_leaves_torch_as_it_is(monkeypatch):
    monkeypatch.setenv("SPECASR_NO_TRICKS", "1")
    with torch.jit.optimized_execution(True), process.plain_calls():
        assert torch._C._is_torch_function_enabled()
        assert torch._C._get_graph_executor_optimize() is True


# what a fresh interpreter (no torch loaded) decides, and the policy it leaves in its environment
DECIDES = (
    "import os; from specasr.backends import process; "
    "print(process.passive_when_busy(), os.environ.get('OMP_WAIT_POLICY'), process.runnable_others())"
)


@pytest.fixture
def hog():
    """A process that keeps one CPU busy while the test runs."""
    import time

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.3)  # past its interpreter's start: spinning
    yield busy
    busy.kill()
    busy.wait()


@pytest.mark.parametrize(
    ("switches", "expected"),
    [
        ({}, "True PASSIVE"),  # a busy machine: OpenMP's idle threads sleep
        ({"OMP_WAIT_POLICY": "ACTIVE"}, "False ACTIVE"),  # the user's policy stays
        ({"GOMP_SPINCOUNT": "1000"}, "False None"),
        ({"SPECASR_PASSIVE_WHEN_BUSY": "0"}, "False None"),  # the trick off
    ],
)
def test_a_command_started_beside_a_busy_process_makes_openmp_wait_passively(hog, switches, expected):
    env = {k: v for k, v in _env().items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run(
        [sys.executable, "-c", DECIDES], env={**env, **switches}, capture_output=True, text=True
    )
    decided, policy, others = out.stdout.split()
    assert f"{decided} {policy}" == expected and int(others) >= 1, out.stderr


def test_the_policy_is_left_alone_once_torch_is_loaded(monkeypatch):
    """The runtime reads its policy when torch loads it: later, setting it would only mislead."""
    assert "torch" in sys.modules  # loaded, as in this test process
    monkeypatch.setattr(process, "runnable_others", lambda *a: 3)
    env: dict[str, str] = {}
    assert not process.passive_when_busy(env) and env == {}


def test_an_idle_read_answers_at_once_and_a_persistent_count_is_the_least_seen(monkeypatch):
    import io

    def reading(*lines: str) -> list[str]:
        texts, opened = iter(lines), []

        def fake_open(path, *a, **k):
            opened.append(path)
            return io.StringIO(f"0.50 0.50 0.50 {next(texts)} 12345\n")

        monkeypatch.setattr("builtins.open", fake_open)
        return opened

    opened = reading("3/90", "2/90", "4/90")  # 2, 1 and 3 others: one of them runnable at every read
    assert process.runnable_others(samples=3, gap=0) == 1 and opened == ["/proc/loadavg"] * 3
    opened = reading("1/90", "5/90")  # only this process: an idle machine, one read
    assert process.runnable_others(samples=3, gap=0) == 0 and len(opened) == 1


# -- one_openmp_team ---------------------------------------------------------------------------


def _tids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _in_thread(work):
    """work() on a fresh thread whose torch ops run on two OpenMP threads -> what it returned."""
    out: list = []

    def run():
        torch.get_num_threads()  # torch's per-thread set-up, before the count below
        process._gomp().omp_set_num_threads(2)
        out.append(work())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[0]


def _start_team() -> set[str]:
    """The threads a parallel region started on the calling thread (its OpenMP team)."""
    before = _tids()
    torch.ones(1 << 22).add_(1)  # far above one thread's grain: a parallel region
    return _tids() - before


def test_torch_runs_on_gnu_openmp_here():
    assert process._gomp() is not None, process.openmp_runtimes()


def test_the_runtime_is_looked_up_once_torch_has_loaded_it():
    """Asked before `import torch` (a CLI's start-up), nothing is found and nothing is kept."""
    code = (
        "from specasr.backends import process as p\n"
        "assert p._gomp() is None and not p.hand_back_team()\n"
        "import torch\n"
        "assert p._gomp() is not None and p.hand_back_team()\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    assert out.stdout.strip() == "ok", out.stderr


def test_a_thread_hands_its_team_back_and_its_threads_end():
    def work():
        team = _start_team()
        handed = process.hand_back_team()
        return team, handed, _tids()

    team, handed, after = _in_thread(work)
    assert team and handed and not team & after


def test_one_openmp_team_off_keeps_the_team(monkeypatch):
    monkeypatch.setenv("SPECASR_ONE_OPENMP_TEAM", "0")

    def work():
        team = _start_team()
        handed = process.hand_back_team()
        left = team & _tids()
        process._gomp().omp_pause_resource_all(process.OMP_PAUSE_HARD)  # tidy up
        return team, handed, left

    team, handed, left = _in_thread(work)
    assert team and not handed and left == team


def test_a_thread_that_prepares_work_runs_torch_on_itself_alone():
    main = torch.get_num_threads()

    def work():
        assert process.one_thread_here()
        return torch.get_num_threads(), _start_team()

    count, team = _in_thread(work)
    assert count == 1 and not team and torch.get_num_threads() == main


def test_a_transcription_hands_its_threads_team_back(monkeypatch):
    """However a thread came to hold a team, its transcription ends without it (a long-lived
    worker thread of an app would otherwise keep its team, and every team would spin less)."""
    from tiny_pairs import random_tiny_pair

    from specasr.options import front_end_options
    from specasr.transcription import transcribe

    pair = random_tiny_pair(seed=0)
    audio = np.zeros(16000, np.float32)

    def work():
        team = _start_team()
        list(transcribe(audio, pair, front_end_options(language="en"), source_rate=16000)[0])
        return team, _tids()

    team, after = _in_thread(work)
    assert team and not team & after


# -- one_thread_decoding -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "switch", "inside"),
    [("passive", "1", 1), ("PASSIVE", "1", 1), ("", "1", 2), ("passive", "0", 2)],
)
def test_the_decoding_loop_runs_on_one_thread_where_waits_are_passive(monkeypatch, policy, switch, inside):
    monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    monkeypatch.setenv("SPECASR_ONE_THREAD_DECODING", switch)

    def work():
        with process.decoding_threads(1):
            count, team = torch.get_num_threads(), _start_team()
        with process.decoding_threads(2):  # a batch keeps its threads
            batch = torch.get_num_threads()
        return count, team, batch, torch.get_num_threads()

    count, team, batch, after = _in_thread(work)
    assert count == inside and batch == 2 and after == 2
    assert (not team) if inside == 1 else True  # one thread starts no team


@pytest.mark.slow  # loads base
def test_one_thread_decoding_keeps_the_tokens(monkeypatch, base_shipped, base_ar, librivox, librivox_mels):
    """Exact decoding with its loop on one thread (passive waits), the C draft step's products
    too, gives target-only decoding's tokens: products split rows, never sums."""
    from specasr.decode.loop import decode
    from specasr.options import DecodeOptions

    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    real, counts = process.decoding_threads, []

    @contextlib.contextmanager
    def watched(rows):
        with real(rows):
            counts.append(torch.get_num_threads())
            yield

    monkeypatch.setattr(process, "decoding_threads", watched)
    clip = librivox[0]
    exact = _in_thread(lambda: decode(base_shipped, librivox_mels[clip.id], DecodeOptions(mode="exact"))[0])
    assert counts and set(counts) == {1}
    assert getattr(base_shipped.draft, "fused", None) is not None  # the C step ran in the loop
    assert exact.tokens == base_ar[clip.id].tokens
