"""Beam search against faster-whisper's, and against greedy: speed and WER on held-out speech.

    python -m benchmarks.beam_fw --corpus CORPUS/heldout --source asterisk:en --per-source 16 --repeats 3

On one recording (windows of a corpus split joined with 1 s silences: speech no draft trained
on), each system transcribes sequentially with timestamps, language "en", Whisper's fallback
schedule, fp32 and int8 for faster-whisper:

- in-process (models loaded once; faster-whisper in a worker of its own, `fw_process`), in
  interleaved rounds: specasr beam 5 (exact mode: on a CPU its beams are the target's alone),
  specasr greedy exact and autoregressive, faster-whisper beam 5 and greedy;
- whole process (`/usr/bin/time`'s view: a fresh process per run, loads included): `specasr
  transcribe --beam-size 5` and greedy, faster-whisper's script with beam 5 and greedy;
- WER of every configuration against the references (the first round's text).

Prints the median wall time, its ratio to faster-whisper's beam 5 at the same compute type, and
the WER.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import click

from benchmarks.longform import corpus_options, recording
from benchmarks.whole_process import compile_bytecode, ct2_dir, run_measured

# faster-whisper's sequential transcribe with the beam size (and best-of) of its fifth argument;
# stdout: the text (as `whole_process.FW_SCRIPT`, which decodes greedily)
FW_BEAM_SCRIPT = """
import sys
from faster_whisper import WhisperModel
model_dir, compute_type, threads, path, beams = sys.argv[1:6]
model = WhisperModel(model_dir, device="cpu", compute_type=compute_type, cpu_threads=int(threads))
kw = {"beam_size": int(beams), "best_of": int(beams), "language": "en", "vad_filter": False}
segments, _ = model.transcribe(path, **kw)
print(" ".join(s.text.strip() for s in segments))
"""


def interleaved(runs: dict, repeats: int) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Each of `runs` (name -> a call returning the text) once to warm up, then `repeats`
    interleaved rounds -> (wall seconds per run, the first round's text per run)."""
    walls, texts = {name: [] for name in runs}, {}
    for run in runs.values():
        run()
    for _ in range(repeats):
        for name, run in runs.items():
            t0 = time.perf_counter()
            text = run()
            walls[name].append(time.perf_counter() - t0)
            texts.setdefault(name, text.strip())
    return walls, texts


def table(title: str, walls: dict, texts: dict, reference: str, ref_name: str) -> str:
    """A markdown table: per run its median wall time, the speed ratio to `ref_name`'s, its WER."""
    from specasr.eval.metric import wer

    ref_wall = statistics.median(walls[ref_name])
    lines = [
        f"\n{title} (× = {ref_name}'s time / this one's):\n",
        "| configuration | wall (median, s) | speed | WER |",
        "|---|---|---|---|",
    ]
    for name in walls:
        wall = statistics.median(walls[name])
        lines.append(
            f"| {name} | {wall:.2f} | {ref_wall / wall:.2f}× | {100 * wer([reference], [texts[name]]):.1f}% |"
        )
    return "\n".join(lines)


@click.command()
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--beams", type=click.IntRange(2, 16), default=5, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=2, show_default=True)
@click.option("--whole/--no-whole", default=True, show_default=True, help="Also whole processes.")
@click.option("--data", default="tests/data", show_default=True)
@corpus_options
def main(repeats, beams, threads, whole, data, corpus, source, per_source) -> None:
    import soundfile as sf

    from benchmarks.fw_process import FasterWhisperProcess
    from benchmarks.serve_load import commit, machine
    from specasr.constants import SAMPLE_RATE
    from specasr.models.loading import load_pair
    from specasr.options import TranscribeOptions
    from specasr.transcription import transcribe

    rec, _ = recording(data, corpus, source, per_source)
    reference = " ".join(rec.texts)
    seconds = len(rec.samples) / SAMPLE_RATE
    work = Path(tempfile.mkdtemp(prefix="specasr-beam-fw-"))
    try:  # the joined model files and the recording are removed whatever happens
        fw_dir = ct2_dir(work)
        pair = load_pair("base", "default", device="cpu")
        base = TranscribeOptions().with_decode(language="en")

        def ours(**decode):
            def run() -> str:
                segments, _ = transcribe(
                    rec.samples, pair, base.with_decode(**decode), source_rate=SAMPLE_RATE
                )
                return " ".join(s.text.strip() for s in segments)

            return run

        fw = {
            (ct, b): FasterWhisperProcess(fw_dir, threads, compute_type=ct, beam_size=b)
            for ct in ("float32", "int8")
            for b in (beams, 1)
        }
        runs = {
            f"specasr beam {beams} (exact mode: target-only beams)": ours(mode="exact", beam_size=beams),
            "specasr greedy, exact": ours(mode="exact"),
            "specasr greedy, autoregressive": ours(mode="autoregressive"),
            **{
                f"faster-whisper {ct}, {'beam ' + str(b) if b > 1 else 'greedy'}": (
                    lambda f=f: f(rec.samples)
                )
                for (ct, b), f in fw.items()
            },
        }
        try:
            walls, texts = interleaved(runs, repeats)
        finally:
            for f in fw.values():
                f.close()
        heard = f"{source}: {per_source} windows, {seconds:.1f} s"
        print(f"# {machine()}; commit {commit()}; {heard}; {repeats} rounds")
        print(table("In-process", walls, texts, reference, f"faster-whisper float32, beam {beams}"))
        if not whole:
            return
        compile_bytecode()
        path = work / "recording.wav"
        sf.write(path, rec.samples, SAMPLE_RATE)
        cli = [
            sys.executable,
            "-m",
            "specasr",
            "transcribe",
            str(path),
            "--language",
            "en",
            "--mode",
            "exact",
        ]
        commands = {
            f"specasr transcribe --beam-size {beams}": [*cli, "--beam-size", str(beams)],
            "specasr transcribe (greedy)": cli,
            **{
                f"faster-whisper {ct} script, beam {b}": [
                    sys.executable,
                    "-c",
                    FW_BEAM_SCRIPT,
                    str(fw_dir),
                    ct,
                    str(threads),
                    str(path),
                    str(b),
                ]
                for ct in ("float32", "int8")
                for b in (beams, 1)
            },
        }
        runs = {name: (lambda c=command: run_measured(c)[2]) for name, command in commands.items()}
        walls, texts = interleaved(runs, repeats)
        print(
            table("Whole processes", walls, texts, reference, f"faster-whisper float32 script, beam {beams}")
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
