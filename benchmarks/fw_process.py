"""faster-whisper in a worker process of its own, for in-process timings beside specasr's.

    run = FasterWhisperProcess(ct2_dir, threads=2, compute_type="int8", batch_size=8)
    text = run(samples)  # transcribes in the worker; the model stays loaded between calls
    run.close()

Why not in the benchmark's own process: CTranslate2's wheel resolves its OpenMP calls
against the first libgomp in the global symbol scope, and in a process that imported torch
that is torch's (`torch/lib/libgomp.so.1`, loaded RTLD_GLOBAL; `LD_DEBUG=bindings` shows
`GOMP_barrier` and `omp_get_max_threads` bound there). One OpenMP runtime then manages
both libraries' thread teams, more threads than cores, and so it stops spinning between
parallel regions: every small torch op pays a futex wake-up. On the 2-core dev box,
specasr's decoding loop ran 1.4× slower after a single CTranslate2 call, for the rest of
the process (docs/benchmarks.md). A user runs one system or the other, so each is timed in
a process of its own: specasr in the benchmark's, faster-whisper here, which never imports
torch. The call's wall time includes one pipe round trip (well under a millisecond).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SERVE = """
import json, sys
import numpy as np
from faster_whisper import BatchedInferencePipeline, WhisperModel
a = json.loads(sys.argv[1])
model = WhisperModel(a["model_dir"], device="cpu", compute_type=a["compute_type"], cpu_threads=a["threads"])
batched = BatchedInferencePipeline(model) if a["batch_size"] else None
audio = None
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    if line.startswith("load "):
        audio = np.load(line[5:].strip())
        print(json.dumps({"loaded": len(audio)}), flush=True)
        continue
    kw = {"beam_size": a["beam_size"], "best_of": a["beam_size"], "language": a["language"]}
    if batched is None:
        segments, _ = model.transcribe(audio, **kw)
    else:
        segments, _ = batched.transcribe(audio, batch_size=a["batch_size"], **kw)
    print(json.dumps({"text": " ".join(s.text for s in segments)}), flush=True)
"""


class FasterWhisperProcess:
    """faster-whisper on `ct2_dir` in a worker process (greedy, or `beam_size` beams and as many
    samples above T = 0): its sequential `transcribe`,
    or with batch_size > 0 its `BatchedInferencePipeline` (Silero VAD cuts, then batched
    windows). Calling it with float32 samples [n] at 16 kHz returns the text; the audio
    crosses over once (as a .npy file) and stays there while the same array is passed."""

    def __init__(
        self,
        ct2_dir: Path,
        threads: int,
        compute_type: str = "float32",
        batch_size: int = 0,
        language: str = "en",
        beam_size: int = 1,
    ) -> None:
        args = {
            "beam_size": beam_size,
            "model_dir": str(ct2_dir),
            "compute_type": compute_type,
            "threads": threads,
            "batch_size": batch_size,
            "language": language,
        }
        self._proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, json.dumps(args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._audio: np.ndarray | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="specasr-fw-")
        self._reply()  # the model is loaded

    def _reply(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the faster-whisper worker exited (code {self._proc.wait()})")
        return json.loads(line)

    def _send(self, line: str) -> dict:
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        return self._reply()

    def __call__(self, samples: np.ndarray) -> str:
        if samples is not self._audio:
            path = Path(self._dir.name) / "audio.npy"
            np.save(path, np.asarray(samples, dtype=np.float32))
            self._send(f"load {path}")
            self._audio = samples
        return self._send("run")["text"]

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()  # the worker's loop ends with its input
            self._proc.wait()
        self._dir.cleanup()
