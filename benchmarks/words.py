"""Word timestamps against faster-whisper's `word_timestamps=True` on the same weights.

    python -m benchmarks.words --model tiny.en [--strategy sequential] [--mode autoregressive]

Both transcribe the long-form fixture (`longform.long_recording`: the LibriVox test clips
twice over, separated by silence); faster-whisper runs the preset's packaged CTranslate2
files (parts joined) in fp32 with greedy decoding. The two word sequences are aligned on
their normalised text (difflib), and for every matched word the absolute differences of
start and of end times are pooled. Acceptance (issue 18): mean <= 0.15 s, p90 <= 0.3 s.
This is an accuracy measure: wall times are not reported.
"""

from __future__ import annotations

import difflib
import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import click
import numpy as np

from benchmarks.longform import SAMPLE_RATE, long_recording
from specasr.options import TranscribeOptions

MEAN_LIMIT, P90_LIMIT = 0.15, 0.3  # seconds (issue 18)


class Timed(NamedTuple):
    word: str
    start: float
    end: float


def normalise(word: str) -> str:
    """Lower case, letters, digits and apostrophes only: " Hello," and "hello" match."""
    return re.sub(r"[^\w']", "", word.lower())


def ours(pair, options: TranscribeOptions, samples: np.ndarray) -> list[Timed]:
    from specasr.transcription import transcribe

    segments, _ = transcribe(samples, pair, options, source_rate=SAMPLE_RATE)
    return [Timed(w.word, w.start, w.end) for s in segments for w in s.words or []]


def fw_dir(preset: str) -> Path:
    """The preset's packaged CTranslate2 files as one directory (`whole_process.ct2_dir`),
    with tiny.en's vocabulary.txt, which ctranslate2 needs beside model.bin."""
    from benchmarks.whole_process import ct2_dir
    from specasr.models.loading import offline_files

    out = ct2_dir(Path(tempfile.gettempdir()) / "specasr-ct2", preset)
    vocabulary = offline_files(preset).config.parent / "vocabulary.txt"
    if vocabulary.is_file() and not (out / vocabulary.name).is_file():
        shutil.copy(vocabulary, out / vocabulary.name)
    return out


def faster_whisper(ct2_dir: Path, samples: np.ndarray, language: str) -> list[Timed]:
    from faster_whisper import WhisperModel

    model = WhisperModel(str(ct2_dir), device="cpu", compute_type="float32")
    segments, _ = model.transcribe(samples, beam_size=1, best_of=1, language=language, word_timestamps=True)
    return [Timed(w.word, w.start, w.end) for s in segments for w in s.words or []]


def matched(a: list[Timed], b: list[Timed]) -> list[tuple[Timed, Timed]]:
    """Pairs of words that the alignment of the two normalised sequences matches."""
    sm = difflib.SequenceMatcher(None, [normalise(w.word) for w in a], [normalise(w.word) for w in b], False)
    return [(a[m.a + k], b[m.b + k]) for m in sm.get_matching_blocks() for k in range(m.size)]


def compare(a: list[Timed], b: list[Timed]) -> dict:
    """Matched-word statistics of a against b: counts, and the pooled |Δstart|, |Δend| (s)."""
    pairs = matched(a, b)
    starts = np.array([abs(x.start - y.start) for x, y in pairs])
    ends = np.array([abs(x.end - y.end) for x, y in pairs])
    both = np.concatenate([starts, ends]) if pairs else np.zeros(1)
    return {
        "words": (len(a), len(b)),
        "matched": len(pairs),
        "mean": float(both.mean()),
        "p90": float(np.percentile(both, 90)),
        "max": float(both.max()),
        "mean_start": float(starts.mean()) if pairs else 0.0,
        "mean_end": float(ends.mean()) if pairs else 0.0,
    }


@click.command()
@click.option("--model", default="tiny.en", show_default=True, help="An offline preset: tiny.en or base.")
@click.option("--draft", default=None, help="A draft for a speculative mode (e.g. self:2).")
@click.option("--mode", default="autoregressive", show_default=True)
@click.option("--strategy", default="sequential", show_default=True)
@click.option(
    "--data", type=click.Path(exists=True, file_okay=False), default="tests/data", show_default=True
)
def main(model, draft, mode, strategy, data) -> None:
    from specasr.models.loading import load_pair

    rec = long_recording(data)
    pair = load_pair(model, draft, device="cpu")
    options = replace(TranscribeOptions(word_timestamps=True), strategy=strategy).with_decode(mode=mode)
    mine = ours(pair, options, rec.samples)
    fw = faster_whisper(fw_dir(model), rec.samples, "en")
    r = compare(mine, fw)
    ok = r["mean"] <= MEAN_LIMIT and r["p90"] <= P90_LIMIT
    click.echo(
        f"{model}, {strategy}, {mode}{f' ({draft})' if draft else ''}, "
        f"{len(rec.samples) / SAMPLE_RATE:.1f} s: words specasr {r['words'][0]}, faster-whisper "
        f"{r['words'][1]}, matched {r['matched']}\n"
        f"|Δ| start+end: mean {r['mean']:.3f} s, p90 {r['p90']:.3f} s, max {r['max']:.3f} s "
        f"(start {r['mean_start']:.3f}, end {r['mean_end']:.3f}); "
        f"acceptance (mean <= {MEAN_LIMIT}, p90 <= {P90_LIMIT}): {'pass' if ok else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
