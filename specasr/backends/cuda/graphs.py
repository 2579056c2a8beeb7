"""CUDA graphs for the device loop: warm-up runs and captures on one side stream, as CUDA
graphs require, and a capture that records without running (`specasr.decode.graphed`).

Nothing here knows the decoding algorithm: each function takes the work as a callable, so the
loop's steps stay one implementation that runs eagerly on a CPU and is captured on CUDA."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class SideStream:
    """One side stream per loop, made on first use; each use first waits for the device's
    current stream, so the side stream's work sees everything queued before it."""

    def __init__(self) -> None:
        self._stream: torch.cuda.Stream | None = None

    def __call__(self, device: torch.device) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=device)
        self._stream.wait_stream(torch.cuda.current_stream(device))
        return self._stream


def warm(work: Callable[[], Any], device: torch.device, stream: torch.cuda.Stream) -> Any:
    """Runs `work` eagerly on `stream` (lazy initialisations happen before any capture) and
    makes the device's current stream wait for it -> work's result."""
    with torch.cuda.stream(stream):
        out = work()
    torch.cuda.current_stream(device).wait_stream(stream)
    return out


def capture(
    work: Callable[[], Any], stream: torch.cuda.Stream, pool=None
) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Records `work` as a CUDA graph on `stream` without running it -> (graph, the tensors
    work returned, which each replay rewrites). pool: share another graph's memory pool."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = work()
    return graph, out


def settle(device: torch.device) -> None:
    """After a failed capture: wait until the device is idle before running eagerly."""
    torch.cuda.synchronize(device)
