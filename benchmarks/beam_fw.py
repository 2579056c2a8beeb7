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


def _median_row(name: str, walls: list[float], text: str, reference: str, ref_wall: float | None) -> str:
    from specasr.eval.metric import wer

    wall = statistics.median(walls)
    ratio = f"{ref_wall / wall:.2f}×" if ref_wall else "—"
    return f"| {name} | {wall:.2f} | {ratio} | {100 * wer([reference], [text]):.1f}% |"


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
    fw_dir = ct2_dir(work)
    pair = load_pair("base", "default", device="cpu")
    base = TranscribeOptions().with_decode(language="en")

    def ours(**decode):
        def run() -> str:
            segments, _ = transcribe(rec.samples, pair, base.with_decode(**decode), source_rate=SAMPLE_RATE)
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
            f"faster-whisper {ct}, {'beam ' + str(b) if b > 1 else 'greedy'}": (lambda f=f: f(rec.samples))
            for (ct, b), f in fw.items()
        },
    }
    walls = {name: [] for name in runs}
    texts = {}
    for run in runs.values():  # warm-up
        run()
    for _ in range(repeats):
        for name, run in runs.items():
            t0 = time.perf_counter()
            text = run()
            walls[name].append(time.perf_counter() - t0)
            texts.setdefault(name, text)
    for f in fw.values():
        f.close()
    print(
        f"# {machine()}; commit {commit()}; {source}: {per_source} windows, {seconds:.1f} s; {repeats} rounds"
    )
    ref_wall = statistics.median(walls[f"faster-whisper float32, beam {beams}"])
    print(f"\nIn-process (× = faster-whisper fp32 beam {beams}'s time / this one's):\n")
    print("| configuration | wall (median, s) | speed vs faster-whisper fp32 beam | WER |")
    print("|---|---|---|---|")
    for name in runs:
        print(_median_row(name, walls[name], texts[name], reference, ref_wall))
    if not whole:
        return
    compile_bytecode()
    path = work / "recording.wav"
    sf.write(path, rec.samples, SAMPLE_RATE)
    cli = [sys.executable, "-m", "specasr", "transcribe", str(path), "--language", "en", "--mode", "exact"]
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
    whole_walls = {name: [] for name in commands}
    outs = {}
    for command in commands.values():
        run_measured(command)
    for _ in range(repeats):
        for name, command in commands.items():
            wall, _, out = run_measured(command)
            whole_walls[name].append(wall)
            outs.setdefault(name, out.strip())
    ref_wall = statistics.median(whole_walls[f"faster-whisper float32 script, beam {beams}"])
    print(f"\nWhole processes (× = faster-whisper fp32 beam {beams}'s time / this one's):\n")
    print("| command | wall (median, s) | speed vs faster-whisper fp32 beam | WER |")
    print("|---|---|---|---|")
    for name in commands:
        print(_median_row(name, whole_walls[name], outs[name], reference, ref_wall))


if __name__ == "__main__":
    main()
