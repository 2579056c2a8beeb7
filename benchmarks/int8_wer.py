"""WER per language of `compute_type="int8"`, with its once-per-window products in int8 (the
encoder's, the cross-attention K/V projections) and in fp32, beside faster-whisper's int8 on the
same recordings.

    python -m benchmarks.int8_wer --corpus CORPUS_EN/heldout --corpus CORPUS_ES/heldout ... \\
        --per-source 16

Each source of each held-out split (`specasr distill corpus DIR --source asterisk:es`) becomes one
long recording (`benchmarks.longform.corpus_recording`: its first `--per-source` windows, 1 s
apart), decoded in the language its corpus names, at T = 0 (exact mode: the target's greedy
tokens), sequentially, chunked (B = 8) and chunked with VAD and no timestamps (what
faster-whisper's batched pipeline decodes). "int8, fp32 window" is the same int8 decoder loaded
with the compiled library off (`SPECASR_FUSED_DRAFT=0`: the encoder and the cross K/V stay fp32,
the head runs through fbgemm, bitwise the library's product). The last row weights each language by its
reference words. WER only: single flips (a hallucinated segment) move a row by points, so read
the totals.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path

import click

from benchmarks.longform import SAMPLE_RATE, _faster_whisper, corpus_recording
from benchmarks.whole_process import ct2_dir
from specasr.eval.metric import wer
from specasr.options import TranscribeOptions, VadOptions

STRATEGIES = ("sequential", "chunked B=8", "chunked B=8 + VAD, no timestamps")


def _pair(fp32_window: bool):
    from specasr.models.loading import load_pair

    before = os.environ.get("SPECASR_FUSED_DRAFT")
    if fp32_window:
        os.environ["SPECASR_FUSED_DRAFT"] = "0"
    try:
        return load_pair("base", "default", compute_type="int8")
    finally:
        if before is None:
            os.environ.pop("SPECASR_FUSED_DRAFT", None)
        else:
            os.environ["SPECASR_FUSED_DRAFT"] = before


def _options(strategy: str, language: str) -> TranscribeOptions:
    base = TranscribeOptions().with_decode(language=language, mode="exact")
    if strategy == "sequential":
        return base
    chunked = replace(base, strategy="chunked", batch_size=8)
    return (
        chunked if "VAD" not in strategy else replace(chunked, vad=VadOptions()).with_decode(timestamps=False)
    )


@click.command()
@click.option(
    "--corpus", "corpora", multiple=True, required=True, type=click.Path(exists=True, file_okay=False)
)
@click.option("--per-source", type=int, default=16, show_default=True)
def main(corpora, per_source) -> None:
    import torch
    from specasr.recipes.speech_corpus import read_manifest

    from specasr.backends.cpu.fused import Int8RowsLinear
    from specasr.transcription import transcribe

    pairs = {"int8": _pair(False), "int8, fp32 window": _pair(True)}
    if not any(isinstance(m, Int8RowsLinear) for m in pairs["int8"].target.model.encoder.modules()):
        raise click.ClickException("the compiled library cannot run here: int8 keeps the fp32 encoder")
    fw_dir = ct2_dir(Path(tempfile.mkdtemp(prefix="specasr-ct2-")), "base")
    columns = [f"{name}, {s}" for name in pairs for s in STRATEGIES]
    columns += ["faster-whisper int8", "faster-whisper batched int8 (B=8)"]
    click.echo("| recording | " + " | ".join(columns) + " |")
    click.echo("|---" * (len(columns) + 1) + "|")
    errors, words = dict.fromkeys(columns, 0.0), 0
    for split in corpora:
        for source in dict.fromkeys(r["source"] for r in read_manifest(split)):
            rec, language = corpus_recording(split, source, per_source)
            reference = " ".join(rec.texts)
            scores = {}
            for name, pair in pairs.items():
                for s in STRATEGIES:
                    segments, _ = transcribe(
                        rec.samples, pair, _options(s, language), source_rate=SAMPLE_RATE
                    )
                    scores[f"{name}, {s}"] = wer([reference], [" ".join(x.text for x in segments)])
            for column, batch in zip(columns[-2:], (0, 8)):
                run = _faster_whisper(fw_dir, torch.get_num_threads(), "int8", batch, language)
                scores[column] = wer([reference], [run(rec.samples)[0]])
                run.close()
            n = len(reference.split())
            words += n
            for c in columns:
                errors[c] += scores[c] * n
            seconds = len(rec.samples) / SAMPLE_RATE
            click.echo(
                f"| {source} ({seconds:.0f} s, {n} words) | "
                + " | ".join(f"{scores[c]:.1%}" for c in columns)
                + " |"
            )
    click.echo(f"| all ({words} words) | " + " | ".join(f"{errors[c] / words:.1%}" for c in columns) + " |")


if __name__ == "__main__":
    main()
