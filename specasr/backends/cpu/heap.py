"""The process's memory policy for large passes: when the encoder's temporaries come from
the C heap (glibc malloc) and when the free heap goes back to the system.

The heap calls themselves (mallopt, malloc_trim) and the CLI's lean policy they build on are
process-wide tricks, owned by `specasr.backends.process` (`lean_heap`, switch
`SPECASR_LEAN_HEAP`). Under the lean policy every block over 2 MB is a fresh mapping,
returned on free.

- `workspace()` lifts that for one many-row pass (the encoder over 1500 frames per window,
  where every product, norm and attention output is a 3–12 MB block). Under the lean
  policy each of those would be a fresh mapping, faulted in page by page, a large share of
  the pass (measured: docs/benchmarks.md, "Start-up"). Inside, large blocks come from the
  heap and are reused from layer to layer; on leaving, the free heap goes back to the
  system (`trim`), so the peak is the pass's live set and nothing stays resident after it.
- `trim()` returns the heap's free memory (malloc_trim), e.g. after loading.

Off glibc, or without the lean policy, both are no-ops (`trim` only returns free memory).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from specasr.backends import process

# bytes, inside `workspace`: blocks up to 1 GB are heap-served (glibc builds that cap the
# threshold refuse it, and the documented 64-bit ceiling, 32 MB, is asked for instead), and
# the heap is not shrunk between layers. mallopt takes a C int: both stay under 2**31.
WORKSPACE_MMAP, WORKSPACE_MMAP_CAPPED = 1 << 30, 32 << 20
WORKSPACE_TRIM = 1 << 30


def trim() -> None:
    """Returns the heap's free memory to the system (`process.malloc_trim`)."""
    process.malloc_trim()


@contextmanager
def workspace() -> Iterator[None]:
    """Large temporaries from the heap while inside, trimmed on leaving (see the module's
    docstring). Nothing changes unless `process.lean_heap` set the policy. Nested and
    concurrent scopes share one heap mode: the last to leave restores the lean policy."""
    with process.heap_scope(WORKSPACE_MMAP, WORKSPACE_TRIM, WORKSPACE_MMAP_CAPPED):
        yield
