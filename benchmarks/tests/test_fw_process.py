"""`benchmarks.fw_process`: faster-whisper timed in a worker process of its own."""

from __future__ import annotations

from importlib.resources import files
from importlib.util import find_spec
from pathlib import Path

import pytest
import soundfile as sf

from benchmarks.fw_process import FasterWhisperProcess
from benchmarks.whole_process import ct2_dir

EXAMPLE = files("specasr") / "assets" / "example.wav"


def test_a_worker_that_cannot_start_is_reported(tmp_path):
    """No model there (or no faster-whisper installed): the worker exits, and the caller gets
    an error that says so instead of waiting on a pipe forever."""
    with pytest.raises(RuntimeError, match="worker exited"):
        FasterWhisperProcess(tmp_path / "missing", threads=1)


@pytest.mark.slow  # base's CTranslate2 files through faster-whisper
@pytest.mark.skipif(find_spec("faster_whisper") is None, reason="faster-whisper is optional (specasr[bench])")
def test_the_worker_transcribes_without_torchs_openmp_runtime(tmp_path):
    """The worker transcribes, keeps the audio between calls, and never maps torch's libgomp:
    CTranslate2's OpenMP calls bind to it when both share a process."""
    samples, rate = sf.read(str(EXAMPLE), dtype="float32")
    assert rate == 16000
    run = FasterWhisperProcess(ct2_dir(tmp_path), threads=2, compute_type="int8", batch_size=8)
    try:
        first, second = run(samples), run(samples)
        maps = Path(f"/proc/{run._proc.pid}/maps").read_text()
    finally:
        run.close()
    assert len(first.split()) > 5 and first == second
    assert "libgomp" in maps and "torch/lib/libgomp" not in maps  # its own runtime, not torch's
    assert run._proc.returncode == 0
