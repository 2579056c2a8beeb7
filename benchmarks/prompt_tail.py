"""How much of a long-form prompt the draft should read, chosen on held-out sources.

    python -m benchmarks.prompt_tail --corpus CORPUS/heldout --per-source 8 \\
        --sources asterisk,fillets --keeps all,16,32,64,120

Sequential long-form decoding prompts each window with up to 223 tokens of the text before
it (<|startofprev|>). `DecodeOptions.draft_prompt` lets the draft read only the last N of them
(`decode.runners.PromptTail`); the target reads them all, so the output is the same and only
the draft's agreement moves. For each held-out source of a corpus written by `specasr distill
corpus --source …` this joins its first `--per-source` windows with 1 s of silence into one
recording, transcribes it in exact mode in the source's language (sequential, timestamps,
the default γ policy and stop) once per N in `--keeps`, and prints α̂ per token and the target
passes. Counts, not times: the machine's noise does not enter, and one run suffices.
"""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from specasr.options import TranscribeOptions


def join_windows(files: list[Path], gap: float = 1.0) -> np.ndarray:
    """The windows one after another, with `gap` seconds of silence after each (16 kHz)."""
    from specasr.audio import load_audio
    from specasr.constants import SAMPLE_RATE

    silence = np.zeros(int(gap * SAMPLE_RATE), dtype=np.float32)
    return np.concatenate([part for f in files for part in (load_audio(str(f)), silence)])


def parse_keeps(text: str) -> list[int | None]:
    """Prompt lengths from "all,16,32": [None, 16, 32]."""
    try:
        keeps = [None if k.strip() == "all" else int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: give 'all' or counts >= 0, comma-separated") from None
    if not keeps or any(k is not None and k < 0 for k in keeps):
        raise click.BadParameter(f"{text!r}: give 'all' or counts >= 0, comma-separated")
    return keeps


def measure(pair, audio: np.ndarray, language: str, keeps: list[int | None]) -> dict:
    """keep -> (α̂ per token, target passes, same tokens as the first keep)."""
    from specasr.constants import SAMPLE_RATE
    from specasr.transcription import transcribe

    out, first = {}, None
    for keep in keeps:
        opts = TranscribeOptions().with_decode(mode="exact", language=language, draft_prompt=keep)
        segments, info = transcribe(audio, pair, opts, source_rate=SAMPLE_RATE)
        tokens = [s.tokens for s in segments]
        first = tokens if first is None else first
        out[keep] = (info.stats.token_acceptance, info.stats.target_calls, tokens == first)
    return out


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--corpus", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True)
@click.option("--per-source", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--sources", default="", help="Comma-separated source prefixes to keep (default: all).")
@click.option("--keeps", default="all,16,32,64,120", show_default=True, help="Prompt tokens the draft reads.")
def main(model: str, draft: str, corpus: Path, per_source: int, sources: str, keeps: str) -> None:
    from benchmarks.languages import corpus_groups
    from specasr.constants import SAMPLE_RATE
    from specasr.models.loading import load_pair

    pair = load_pair(model, draft)
    wanted = tuple(s.strip() for s in sources.split(",") if s.strip())
    ns = parse_keeps(keeps)
    names = ["all" if n is None else str(n) for n in ns]
    click.echo(
        f"{model} + {draft}; exact, sequential long-form with timestamps; α̂ per token (target passes)\n"
    )
    click.echo("| source | language | audio s | " + " | ".join(f"draft reads {n}" for n in names) + " |")
    click.echo("|---" * (3 + len(ns)) + "|")
    totals = {n: [0.0, 0] for n in ns}
    count = 0
    for source, (lang, files) in sorted(corpus_groups(corpus, per_source).items()):
        if wanted and not source.startswith(wanted):
            continue
        audio = join_windows(files)
        row = measure(pair, audio, lang, ns)
        cells = [f"{a:.3f} ({c}){'' if same else ' ≠'}" for a, c, same in row.values()]
        click.echo(f"| {source} | {lang} | {len(audio) / SAMPLE_RATE:.0f} | " + " | ".join(cells) + " |")
        count += 1
        for n, (a, c, _) in row.items():
            totals[n][0] += a
            totals[n][1] += c
    if not count:
        raise click.UsageError(f"no source of {corpus} matches {sources!r}")
    means = ", ".join(f"{name}: {a / count:.3f} ({c})" for name, (a, c) in zip(names, totals.values()))
    click.echo(f"\nmean α̂ over {count} sources (all target passes): {means}")
    click.echo("≠: other tokens than the first column's (a window that fell back to sampling)")


if __name__ == "__main__":
    main()
