"""The process's heap policy: the CLI's lean policy (`specasr.backends.process.lean_heap`) and
the workspace scope the encoder runs in (`specasr.backends.cpu.heap`)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from specasr.backends import process
from specasr.backends.cpu import heap


@pytest.fixture()
def calls(heap_calls):
    return heap_calls


def test_workspace_changes_nothing_without_the_lean_policy(calls):
    with heap.workspace():
        pass
    assert calls == [] and not process.is_lean()


def test_nested_and_concurrent_scopes_share_one_heap_mode(calls):
    process.lean_heap()
    assert calls == [("set", process.LEAN_MMAP, process.TRIM_DEFAULT)]
    calls.clear()
    entered, release = threading.Event(), threading.Event()

    def other():
        with heap.workspace():
            entered.set()
            release.wait(5)

    with heap.workspace():
        with heap.workspace():  # nested: no second switch
            pass
        t = threading.Thread(target=other)
        t.start()
        assert entered.wait(5)
    assert calls == [("set", heap.WORKSPACE_MMAP, heap.WORKSPACE_TRIM, heap.WORKSPACE_MMAP_CAPPED)]
    release.set()  # the last scope to leave restores the lean policy and trims
    t.join(5)
    assert calls[1:] == [("set", process.LEAN_MMAP, process.TRIM_DEFAULT), ("trim",)]
    assert process._depth == 0


def test_lean_policy_set_inside_a_scope_waits_for_it_to_close(calls):
    process.lean_heap()
    calls.clear()
    with heap.workspace():
        process.lean_heap()  # e.g. a second CLI entry point in the same process
        assert calls == [("set", heap.WORKSPACE_MMAP, heap.WORKSPACE_TRIM, heap.WORKSPACE_MMAP_CAPPED)]
    assert calls[-2:] == [("set", process.LEAN_MMAP, process.TRIM_DEFAULT), ("trim",)]


# Run in a fresh process: the policy is process-wide. Under the lean policy every 8 MB block
# is a fresh mapping, faulted in page by page each time (2048 faults); inside the workspace
# the heap grows to hold it and then serves it again (a layer's blocks, the next layer).
FAULTS = """
import resource, torch
from specasr.backends import process
from specasr.backends.cpu import heap
process.lean_heap()

def faults(n=10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        torch.ones(2 << 20)  # 8 MB, touched, freed
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

outside = faults()
with heap.workspace():
    faults()  # the heap grows
    inside = faults()
print(outside, inside)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc policy")
def test_the_workspace_reuses_large_blocks_instead_of_faulting_them_in_again():
    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, check=True)
    outside, inside = map(int, out.stdout.split())
    assert outside > 10 * 1500  # every block faulted in afresh
    assert inside < outside / 10


_COLLECTOR = """
import gc, json, sys
from specasr.backends import process
if sys.argv[1] == "off":
    gc.disable()
frozen = gc.get_freeze_count()
with process.collector_paused(freeze=sys.argv[2] == "freeze"):
    inside = gc.isenabled()
    with process.collector_paused(freeze=True):  # nested: the outer scope decides
        nested = gc.isenabled()
    after_nested = (gc.isenabled(), gc.get_freeze_count() - frozen)
    made = [[i] for i in range(1000)]  # containers the collector tracks

@process.collector_paused()
def load():
    return gc.isenabled()

print(json.dumps({"inside": inside, "nested": nested, "after_nested": after_nested,
                  "after": gc.isenabled(), "frozen": gc.get_freeze_count() - frozen >= 1000,
                  "decorated": load(), "after_decorated": gc.isenabled()}))
"""


@pytest.mark.parametrize(
    ("collector", "freeze", "expect"),
    [
        ("on", "freeze", {"after": True, "frozen": True, "after_decorated": True}),
        ("on", "keep", {"after": True, "frozen": False, "after_decorated": True}),
        ("off", "freeze", {"after": False, "frozen": False, "after_decorated": False}),  # caller's
    ],
)
def test_collector_paused_restores_and_freezes_only_when_asked(collector, freeze, expect):
    """In a fresh process (a freeze would outlive the test): the collector is off inside,
    nested scopes neither resume nor freeze it, and on leaving it is as it was."""
    import json

    out = subprocess.run(
        [sys.executable, "-c", _COLLECTOR, collector, freeze], capture_output=True, text=True, check=True
    ).stdout
    seen = json.loads(out)
    assert seen["inside"] is False and seen["nested"] is False and seen["decorated"] is False
    assert seen["after_nested"] == [False, 0]
    assert {k: seen[k] for k in expect} == expect


@pytest.mark.parametrize("strategy", ["sequential", "chunked", "clip"])
def test_a_transcription_decodes_every_window_in_one_workspace(
    strategy, calls, monkeypatch, tiny_en_pair, librivox
):
    """Under the lean policy, every window's encoder pass and decoding loop of one
    transcription (a clip: its one decode) run inside one workspace: their large
    temporaries (activations, a pass's logits, cross K/V) are heap-served and reused instead
    of mapped and faulted in afresh at every step, and the heap is trimmed once, at the end."""
    from benchmarks.longform import long_recording
    from specasr.decode import loop
    from specasr.options import DecodeOptions, TranscribeOptions
    from specasr.transcription import transcribe, transcribe_clip

    process.lean_heap()
    calls.clear()
    depths = []
    run = loop.DecodeLoop.run

    def recorded(self, *args):
        depths.append(process._depth)
        return run(self, *args)

    monkeypatch.setattr(loop.DecodeLoop, "run", recorded)
    options = DecodeOptions(mode="autoregressive", language="en")
    if strategy == "clip":
        transcribe_clip(librivox[0].path, tiny_en_pair, options)
    else:  # 75 s: three or more windows, in batches of one
        rec = long_recording(librivox[0].path.parent)
        opts = TranscribeOptions(strategy=strategy, batch_size=1, decode=options)
        segments, _ = transcribe(rec.samples, tiny_en_pair, opts, source_rate=16000)
        assert process._depth == 0  # nothing is decoded, and no scope opened, before iterating
        list(segments)
        assert len(depths) >= 3
    assert all(d >= 1 for d in depths)  # every decode ran inside a scope
    switches = [c for c in calls if c[0] == "set" and c[1] == heap.WORKSPACE_MMAP]
    assert len(switches) == 1  # one scope: the encoder's own scopes nest in it
    assert calls[-1] == ("trim",) and process._depth == 0
    trims = calls.count(("trim",))
    # chunked: also before every round of windows but the first (a round's caches, freed, go
    # back to the system: rows come and go between rounds, and the heap kept growing)
    assert trims == (len(depths) if strategy == "chunked" else 1)
