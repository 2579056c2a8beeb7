"""Long-form real-time factor: autoregressive, speculative and chunked decoding side by side.

    python -m benchmarks.longform --model tiny.en --draft self:2 --repeats 3 [--faster-whisper] [--vad]
        [--compute-type float32,int8] [--corpus CORPUS/heldout --source asterisk:en --per-source 16]

With --vad, sequential and chunked decoding of only the speech Silero VAD finds are added (VAD
time included); the issue-18 target is chunked + VAD + speculative against sequential autoregressive.
Chunked + VAD also runs without timestamps (text tokens only, one segment per window), which is
what faster-whisper's `BatchedInferencePipeline` decodes by default (`without_timestamps=True`).
Each width in --device-width (the CUDA device loop's target passes, `DecodeOptions.device_width`)
and each compute type in --compute-type adds its own rows (one model pair each; an int8 target's
speculative rows are exact against its own autoregressive rows). --faster-whisper adds
its sequential `transcribe` and its `BatchedInferencePipeline` (VAD + batched windows) in fp32 and int8,
each in a worker process of its own (`fw_process`: CTranslate2's OpenMP calls bind to torch's
runtime in a shared process, which slowed specasr's decoder 1.4×); models stay loaded in both.

Every configuration transcribes the same long recording (`long_recording`: the LibriVox
test clips twice over, separated by silence; with --corpus, `corpus_recording`: held-out
speech no draft trained on), interleaved and repeated, so machine noise hits all alike.
Wall time covers log-Mel, encoder and decoder; the table reports medians.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import click
import numpy as np
import soundfile as sf

from specasr.cli.common import dtype_option, torch_dtype
from specasr.eval.metric import wer
from specasr.options import TranscribeOptions, VadOptions

SAMPLE_RATE = 16000
LEAD_IN = 0.5  # seconds of silence before the first clip
GAPS = (2.0, 2.5, 3.0)  # silences between clips, in turn


class LongRecording(NamedTuple):
    samples: np.ndarray  # float32 [n] at 16 kHz
    clips: list[tuple[float, float]]  # (start, end) seconds of each clip in the recording
    texts: list[str]  # reference transcript per clip


def fixture_clips(data_dir: str | Path) -> list[tuple[np.ndarray, str]]:
    """The clips listed in `data_dir`/transcripts.txt ('<id> <text>' lines), in order: each
    one's float32 samples [n] at 16 kHz (mono, checked) and its reference text."""
    data_dir = Path(data_dir)
    rows = [line.split(maxsplit=1) for line in (data_dir / "transcripts.txt").read_text().splitlines()]
    out = []
    for clip_id, text in (r for r in rows if r):
        x, sr = sf.read(data_dir / f"{clip_id}.wav", dtype="float32")
        if sr != SAMPLE_RATE or x.ndim != 1:
            raise ValueError(f"{clip_id}.wav: expected 16 kHz mono")
        out.append((x, text))
    return out


def long_recording(data_dir: str | Path, repeats: int = 2) -> LongRecording:
    """The clips listed in `data_dir`/transcripts.txt, `repeats` times over, with silences."""
    rows = fixture_clips(data_dir)
    parts, clips, texts = [np.zeros(int(LEAD_IN * SAMPLE_RATE), np.float32)], [], []
    t = LEAD_IN
    for rep in range(repeats):
        for i, (x, text) in enumerate(rows):
            gap = GAPS[(i + rep) % len(GAPS)]
            clips.append((t, t + len(x) / SAMPLE_RATE))
            texts.append(text)
            parts += [x, np.zeros(int(gap * SAMPLE_RATE), np.float32)]
            t += len(x) / SAMPLE_RATE + gap
    return LongRecording(np.concatenate(parts), clips, texts)


def corpus_recording(
    split: str | Path, source: str, count: int, gap: float = 1.0
) -> tuple[LongRecording, str]:
    """The first `count` windows of `source` in split/corpus.jsonl (a speech corpus of
    `specasr distill corpus`, e.g. its held-out split) one after another, each followed by
    `gap` s of silence (`prompt_tail.join_windows`), with their texts as references; and the
    source's language."""
    from specasr.recipes.speech_corpus import read_manifest

    from benchmarks.prompt_tail import join_windows

    records = [r for r in read_manifest(split) if r.get("source") == source][:count]
    if not records:
        raise click.BadParameter(f"no windows of {source!r} in {split}/corpus.jsonl", param_hint="'--source'")
    files = [Path(split) / r["path"] for r in records]
    clips, t = [], 0.0
    for f in files:
        seconds = sf.info(f).duration
        clips.append((t, t + seconds))
        t += seconds + gap
    texts = [" ".join(r["texts"]) for r in records]
    return LongRecording(join_windows(files, gap), clips, texts), records[0]["language"]


def recording(
    data: str | Path, corpus: str | Path | None, source: str, per_source: int
) -> tuple[LongRecording, str | None]:
    """The fixture of `data` (language None: not named), or with `corpus` its
    `corpus_recording` of `source` (and that source's language)."""
    return (long_recording(data), None) if corpus is None else corpus_recording(corpus, source, per_source)


def corpus_options(f):
    """The `--corpus`, `--source` and `--per-source` options of the long-form benchmarks."""
    options = [
        click.option(
            "--corpus",
            type=click.Path(exists=True, file_okay=False),
            default=None,
            help="Instead of the LibriVox fixture: windows of a speech corpus split (corpus.jsonl) "
            "joined with 1 s silences, e.g. the held-out split, which no draft trained on.",
        ),
        click.option("--source", default="asterisk:en", show_default=True, help="--corpus: the source."),
        click.option("--per-source", type=int, default=16, show_default=True, help="--corpus: its windows."),
    ]
    for option in reversed(options):  # applied bottom-up, as stacked decorators are
        f = option(f)
    return f


def _ours(pair, options: TranscribeOptions):
    from specasr.transcription import transcribe

    def run(audio: np.ndarray):
        segments, info = transcribe(audio, pair, options, source_rate=SAMPLE_RATE)
        segments = list(segments)
        return " ".join(s.text for s in segments), [s.tokens for s in segments], info.stats

    return run


def _faster_whisper(
    ct2_dir: Path, threads: int, compute_type: str = "float32", batch_size: int = 0, language: str = "en"
):
    """faster-whisper greedy on the same weights, in a worker process of its own
    (`fw_process`: in this process its OpenMP calls would share torch's runtime and slow
    both): its sequential `transcribe`, or with batch_size > 0 its `BatchedInferencePipeline`."""
    from benchmarks.fw_process import FasterWhisperProcess

    worker = FasterWhisperProcess(ct2_dir, threads, compute_type, batch_size, language)

    def run(audio: np.ndarray):
        return worker(audio), None, None

    run.close = worker.close
    return run


@click.command()
@click.option("--model", default="tiny.en", show_default=True)
@click.option("--draft", default="self:2", show_default=True)
@click.option("--mode", default="exact", show_default=True, help="Speculative verifier mode.")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Windows per chunked batch.")
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option(
    "--data", type=click.Path(exists=True, file_okay=False), default="tests/data", show_default=True
)
@click.option(
    "--faster-whisper", "with_fw", is_flag=True, help="Add faster-whisper on the packaged CT2 files."
)
@click.option("--device", default="cpu", show_default=True)
@dtype_option
@click.option("--vad", "with_vad", is_flag=True, help="Add sequential and chunked runs with Silero VAD.")
@click.option(
    "--compute-type",
    "compute_types",
    default="float32",
    show_default=True,
    help="Comma-separated target compute types; each adds its own rows (int8: `load_pair(compute_type=)`).",
)
@corpus_options
@click.option(
    "--device-width",
    "widths",
    default="matched",
    show_default=True,
    help="Comma-separated `DecodeOptions.device_width`s (the CUDA device loop's target passes); "
    "each adds its own rows, e.g. matched,natural.",
)
@click.option(
    "--only",
    default=None,
    help="Comma-separated parts of configuration names: run only the rows whose name holds "
    "one (and faster-whisper's), e.g. 'no timestamps' for a longer head-to-head.",
)
@click.option(
    "--cut-search",
    type=float,
    default=TranscribeOptions.cut_search,
    show_default=True,
    help="Chunked: seconds before each 30 s limit searched for the quietest cut.",
)
def main(
    model,
    draft,
    mode,
    batch_size,
    repeats,
    data,
    with_fw,
    device,
    dtype,
    with_vad,
    compute_types,
    corpus,
    source,
    per_source,
    widths,
    only,
    cut_search,
) -> None:
    import torch

    from specasr.models.loading import load_pair

    rec, language = recording(data, corpus, source, per_source)
    language = language or "en"
    duration = len(rec.samples) / SAMPLE_RATE
    base = TranscribeOptions(cut_search=cut_search).with_decode(language=language)
    ar = base.with_decode(mode="autoregressive")
    spec = base.with_decode(mode=mode)
    chunked = f"chunked B={batch_size}"
    variants = [  # (strategy, row label, VAD, timestamps, a speculative row too)
        ("sequential", "sequential", False, True, True),
        ("chunked", chunked, False, True, True),
    ]
    if with_vad:
        variants += [
            ("sequential", "sequential + VAD", True, True, False),
            ("chunked", f"{chunked} + VAD", True, True, True),
            # text tokens only, one segment per window: what faster-whisper's batched pipeline decodes
            ("chunked", f"{chunked} + VAD, no timestamps", True, False, True),
        ]
    configs = {}
    pairs: list[tuple[str, str, str]] = []  # (label, autoregressive row, speculative row)
    runs = []  # (pair, tag, autoregressive options, speculative options)
    for ct in compute_types.split(","):
        pair = load_pair(model, draft, device=device, dtype=torch_dtype(dtype), compute_type=ct)
        for width in widths.split(","):
            marks = ([] if ct == "float32" else [ct]) + ([] if width == "matched" else [f"{width} width"])
            tag = f" [{', '.join(marks)}]" if marks else ""
            runs.append((pair, tag, *(o.with_decode(device_width=width) for o in (ar, spec))))
    for pair, tag, ar_w, spec_w in runs:
        for strategy, label, vad, timestamps, speculates in variants:
            names = [f"{label}, autoregressive{tag}"]
            if speculates:
                names.append(f"{label}, speculative ({mode}, {draft}){tag}")
                pairs.append((f"{label.replace(f' B={batch_size}', '')}{tag}", *names))
            for name, options in zip(names, (ar_w, spec_w)):
                options = replace(options, strategy=strategy, vad=VadOptions() if vad else None)
                options = replace(options, batch_size=batch_size) if strategy == "chunked" else options
                configs[name] = _ours(pair, options.with_decode(timestamps=timestamps))

    def fw_batched(ct: str) -> str:
        return f"faster-whisper batched B={batch_size} + VAD, no timestamps (CTranslate2 {ct}, greedy)"

    if with_fw:  # the same weights: the preset's packaged CTranslate2 files, parts joined
        import tempfile

        from benchmarks.whole_process import ct2_dir

        fw_dir = ct2_dir(Path(tempfile.mkdtemp(prefix="specasr-ct2-")), model)
        for ct in ("float32", "int8"):
            configs[f"faster-whisper (CTranslate2 {ct}, greedy)"] = _faster_whisper(
                fw_dir, torch.get_num_threads(), ct, language=language
            )
            configs[fw_batched(ct)] = _faster_whisper(
                fw_dir, torch.get_num_threads(), ct, batch_size, language
            )
    if only:
        parts = [p.strip() for p in only.split(",") if p.strip()]
        configs = {
            n: r for n, r in configs.items() if n.startswith("faster-whisper") or any(p in n for p in parts)
        }
        if not configs:
            raise click.BadParameter(f"{only!r} matches no configuration", param_hint="'--only'")
    times: dict[str, list[float]] = {name: [] for name in configs}
    outputs = {}
    for name, run in configs.items():  # warm-up, and the transcripts
        outputs[name] = run(rec.samples)
    for _ in range(repeats):
        for name, run in configs.items():
            t0 = time.perf_counter()
            run(rec.samples)
            times[name].append(time.perf_counter() - t0)
    for run in configs.values():
        getattr(run, "close", lambda: None)()  # faster-whisper's worker processes
    names = list(configs)
    ref = statistics.median(times[names[0]])
    # machine speed drifts within a run: each repeat's fw int8 batched time over this row's, then the median
    fw = times.get(fw_batched("int8"))
    paired = {n: statistics.median(f / t for f, t in zip(fw, times[n])) for n in names} if fw else {}
    identical = [
        f"{label} {'yes' if outputs[a][1] == outputs[b][1] else 'NO'}"
        for label, a, b in pairs
        if a in outputs and b in outputs
    ]
    click.echo(
        f"{model} (draft {draft}) on {duration:.1f} s of audio, device {device}"
        f"{'' if dtype is None else ' ' + dtype}, "
        f"{torch.get_num_threads()} threads, {repeats} repeats; speculative tokens identical to "
        f"autoregressive at T=0: {', '.join(identical)}\n"
    )
    vs_fw = " speed vs fw int8 batched (paired) |" if paired else ""
    click.echo(
        f"| configuration | wall s (median) | real-time factor | speed vs {names[0]} | α̂ | WER |{vs_fw}"
    )
    click.echo("|---|---|---|---|---|---|" + ("---|" if paired else ""))
    for name in names:
        med = statistics.median(times[name])
        text, _, stats = outputs[name]
        alpha = f"{stats.acceptance_rate:.3f}" if stats is not None and stats.proposed else "–"
        score = wer([" ".join(rec.texts)], [text])
        extra = f" {paired[name]:.2f}× |" if paired else ""
        click.echo(
            f"| {name} | {med:.2f} | {med / duration:.3f} | {ref / med:.2f}× | {alpha} | {score:.1%} |{extra}"
        )


if __name__ == "__main__":
    main()
