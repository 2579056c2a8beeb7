"""Per language and per source: does the draft pay, on speech it was never trained on?

    python -m benchmarks.languages --corpus CORPUS/heldout --per-source 6 \\
        --espeak ja,zh,hi,ar --compare packaged:base --repeats 2

Rows come from two kinds of audio:
- `--corpus DIR`: a held-out split written by `specasr distill corpus --source …`
  (`recipes/speech_corpus.py`): whole prompts, levels and voices no draft trained on.
  Windows are grouped by source; each window is decoded in the language its corpus names.
- `CLIPS`: audio files in `--clips-language` (one row), e.g. the LibriVox fixtures;
- `--espeak LANGS`: a few sentences per language spoken by espeak-ng
  (`benchmarks.backoff.SENTENCES`), for languages no draft was trained on.

Per row, each window is encoded once. Then, with the language given (no detection):
- α̂: per-token acceptance of `--draft` with a fixed γ (untimed; `--compare` drafts too);
- the decoder phase of autoregressive and of exact with the default γ policy, interleaved,
  `--repeats` rounds after a warm-up round, summed over the row's windows (medians), and
  exact's speed against autoregressive;
- whether exact gave autoregressive's tokens (T = 0).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

import click

from specasr.options import DecodeOptions


def corpus_groups(split: Path, per_source: int) -> dict[str, tuple[str, list[Path]]]:
    """source -> (language, the first `per_source` window files), from split/corpus.jsonl."""
    from specasr.recipes.speech_corpus import read_manifest

    groups: dict[str, tuple[str, list[Path]]] = {}
    for rec in read_manifest(split):
        lang, files = groups.setdefault(rec["source"], (rec["language"], []))
        if len(files) < per_source:
            files.append(split / rec["path"])
    return groups


def token_alpha(pair, states, lang: str, gamma: int = 7, **decode) -> tuple[float, list]:
    """Per-token α̂ of pair's draft with a fixed γ over encoded windows, and the tokens.
    decode: further DecodeOptions fields."""
    from specasr.decode.loop import decode_states
    from specasr.stats import DecodeStats

    opts = DecodeOptions(mode="exact", language=lang, gamma=gamma, gamma_policy="fixed", **decode)
    total, tokens = DecodeStats(), []
    for target_states, draft_states in states:
        res = decode_states(pair, target_states, draft_states, opts)[0]
        total = total.merge(res.stats)
        tokens.append(res.tokens)
    return total.token_acceptance, tokens


def measure(pair, states, lang: str, repeats: int, **decode) -> dict:
    """Interleaved decoder-phase times of autoregressive and exact (default γ policy)."""
    from specasr.decode.loop import decode_states

    base = DecodeOptions(language=lang, timing=True, **decode)
    configs = {"ar": replace(base, mode="autoregressive"), "exact": replace(base, mode="exact")}
    times = {k: [] for k in configs}
    tokens = {}
    for rnd in range(repeats + 1):  # round 0 warms up
        for name, opts in configs.items():
            results = [decode_states(pair, t, d, opts)[0] for t, d in states]
            if rnd:
                times[name].append(sum(r.stats.decoder_s for r in results))
            tokens[name] = [r.tokens for r in results]
    ar, ex = statistics.median(times["ar"]), statistics.median(times["exact"])
    return {
        "ar_s": ar,
        "exact_s": ex,
        "speed": ar / ex,
        "same": tokens["ar"] == tokens["exact"],
        "tokens": sum(map(len, tokens["ar"])),
    }


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True, help="The draft timed and reported.")
@click.option("--compare", multiple=True, help="Other drafts: their α̂ on the same windows (untimed).")
@click.option("--corpus", "corpora", multiple=True, type=click.Path(exists=True, file_okay=False))
@click.option("--per-source", type=int, default=6, show_default=True)
@click.argument("clips", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("--clips-language", default="en", show_default=True, help="The language of CLIPS.")
@click.option("--espeak", default="", help="Comma-separated languages to synthesise with espeak-ng.")
@click.option("--repeats", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Also write rows here."
)
def main(
    model, draft, compare, corpora, per_source, clips, clips_language, espeak, repeats, json_out
) -> None:
    from benchmarks.backoff import synthesise
    from specasr.eval.bench import file_mels
    from specasr.models.loading import load_pair

    pair = load_pair(model, draft)
    others = {spec: load_pair(model, spec) for spec in compare}
    rows = []
    with tempfile.TemporaryDirectory(prefix="specasr-languages-") as tmp:
        groups = {}
        for split in corpora:
            for source, (lang, files) in corpus_groups(Path(split), per_source).items():
                groups[source] = (lang, files)
        if clips:
            groups["clips"] = (clips_language, [Path(c) for c in clips])
        for lang in filter(None, espeak.split(",")):
            groups[f"espeak-sentences:{lang}"] = (lang, synthesise(lang, Path(tmp)))
        for source, (lang, files) in groups.items():
            states = [pair.encode(mel) for mel in file_mels(pair, files)]
            row = {"source": source, "language": lang, "windows": len(files)}
            row["alpha"], _ = token_alpha(pair, states, lang)
            for spec, other in others.items():  # same target and encoder: the states serve both
                row[f"alpha {spec}"], _ = token_alpha(other, [(t, t) for t, _ in states], lang)
            row |= measure(pair, states, lang, repeats)
            rows.append(row)
            click.echo(json.dumps(row, ensure_ascii=False), err=True)
    click.echo(
        f"\n{model} + {pair.draft_name}; decoder phase, median of {repeats}; exact = default γ policy\n"
    )
    cols = [
        "source",
        "language",
        "windows",
        "tokens",
        "α̂",
        *(f"α̂ {s}" for s in compare),
        "exact vs AR",
        "same",
    ]
    click.echo("| " + " | ".join(cols) + " |")
    click.echo("|" + "---|" * len(cols))
    for r in rows:
        cells = [r["source"], r["language"], str(r["windows"]), str(r["tokens"]), f"{r['alpha']:.3f}"]
        cells += [f"{r[f'alpha {s}']:.3f}" for s in compare]
        cells += [f"{r['speed']:.2f}×", "yes" if r["same"] else "NO"]
        click.echo("| " + " | ".join(cells) + " |")
    if json_out:
        Path(json_out).write_text(json.dumps(rows, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
