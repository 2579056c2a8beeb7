"""`specasr distill`: make a fast draft for a target (corpus synthesis, then distillation)."""

from __future__ import annotations

import json
import sys

import click

from specasr.cli.common import compute_type_option, load_models


@click.group()
def distill() -> None:
    """Distil a shallow, reduced-vocabulary draft for a Whisper target."""


@distill.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option(
    "--source",
    "sources",
    multiple=True,
    help="Real or multilingual speech: asterisk:{en,es,fr,it,ru}, fillets:{cs,nl} or espeak:LANG "
    "(repeatable). Writes OUT_DIR/train and OUT_DIR/heldout, held out by prompt, level and voice. "
    "Without it: English TTS windows.",
)
@click.option(
    "--windows",
    type=int,
    default=None,
    help="Windows to write: in all for TTS (default 1500), per source and split with --source (default 60).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--workers", type=int, default=2, show_default=True)
@click.option(
    "--exclude",
    "exclude_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Transcripts file ('<id> <text>' lines) whose texts must not be spoken (held-out test sets).",
)
def corpus(out_dir, sources, windows, seed, workers, exclude_file):
    """Write training audio into OUT_DIR (resumable): English TTS, or the --source speech."""
    from tqdm import tqdm

    if sources:
        from specasr.recipes.speech_corpus import SpeechCorpusOptions, make_speech_corpus

        try:
            opts = SpeechCorpusOptions(sources=tuple(sources), windows=windows or 60, seed=seed)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--source") from None
        try:
            with tqdm(desc="corpus", unit="window") as bar:
                make_speech_corpus(out_dir, opts, bar.update)
        except RuntimeError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        return

    from specasr.recipes.tts_corpus import CorpusOptions, make_corpus

    windows = windows or 1500
    exclude = []
    if exclude_file:
        with open(exclude_file) as f:
            exclude = [ln.split(maxsplit=1)[1] for ln in f if len(ln.split(maxsplit=1)) == 2]
    try:
        with tqdm(total=windows, desc="corpus", unit="window") as bar:
            make_corpus(
                out_dir, CorpusOptions(windows=windows, seed=seed, workers=workers), exclude, bar.update
            )
    except RuntimeError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


def _layers(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated layer indices, got {value!r}") from None


@distill.command()
@click.argument("audio_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--model", default="base", show_default=True, help="Target: preset, HF id or directory.")
@click.option(
    "--out", "out_file", required=True, type=click.Path(dir_okay=False), help="Draft file (.safetensors)."
)
@click.option(
    "--work", "work_dir", required=True, type=click.Path(file_okay=False), help="Cache / resume dir."
)
@click.option("--layers", default="0,-1", show_default=True, help="Target decoder layers to start from.")
@click.option("--vocab", type=int, default=16384, show_default=True, help="Draft vocabulary (0 = full).")
@click.option("--epochs", type=int, default=6, show_default=True)
@click.option("--batch-size", type=int, default=16, show_default=True)
@click.option("--lr", type=float, default=5e-4, show_default=True)
@click.option(
    "--language",
    default="en",
    show_default=True,
    help="Label language ('auto': detect). A corpus.jsonl that names each window's language wins.",
)
@click.option(
    "--init", default=None, help="Start from this draft (a file or packaged:NAME), not target layers."
)
@click.option("--max-windows", type=int, default=None, help="Use at most this many windows.")
@click.option(
    "--cross-pool",
    type=int,
    default=1,
    show_default=True,
    help="Attend over the means of this many adjacent encoder frames (1 to 6): a cheaper draft step.",
)
@click.option(
    "--stop-after", type=click.Choice(["label", "teacher", "train"]), default="train", show_default=True
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default=None, help="cpu, cuda … (default: cuda when available).")
@compute_type_option(
    "The target's compute type for labels and teacher (`load_pair(compute_type=)`): a draft for an "
    "int8 or bfloat16 target learns that target's encoder states and tokens."
)
def train(
    audio_dir,
    model,
    out_file,
    work_dir,
    layers,
    vocab,
    epochs,
    batch_size,
    lr,
    language,
    init,
    max_windows,
    cross_pool,
    stop_after,
    seed,
    device,
    compute_type,
):
    """Label AUDIO_DIR with the target's greedy transcripts and train a draft on them."""
    from specasr.options import language_of
    from specasr.recipes.distill_draft import DistillOptions
    from specasr.recipes.distill_draft import distill as run

    if not out_file.endswith(".safetensors"):
        raise click.BadParameter("the draft file must end in .safetensors", param_hint="--out")
    try:
        opts = DistillOptions(
            layers=_layers(layers),
            vocab=vocab,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            language=language_of(language),
            init=init,
            max_windows=max_windows,
            cross_pool=cross_pool,
            seed=seed,
        )
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    pair = load_models(model, "none", "autoregressive", device, "fp32", compute_type)
    try:
        summary = run(pair, audio_dir, out_file, work_dir, opts, log=click.echo, stop_after=stop_after)
    except (FileNotFoundError, RuntimeError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    if stop_after == "train":
        click.echo(f"wrote {out_file}: {json.dumps(summary['history'][-1])}")
    else:
        click.echo(json.dumps(summary))


@distill.command()
@click.argument("base")
@click.argument("other")
@click.option("--weight", type=float, required=True, help="OTHER's share, 0 to 1.")
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False), help="Draft file.")
@click.option("--cross-pool", type=int, default=None, help="Its frame pooling (default: both drafts').")
def average(base, other, weight, out_file, cross_pool):
    """Write (1 - WEIGHT) * BASE + WEIGHT * OTHER: two drafts of the same shapes (files or
    packaged:NAME), with BASE's vocabulary and metadata."""
    from specasr.recipes.distill_draft import average_drafts

    try:
        meta = average_drafts(base, other, weight, out_file, cross_pool)
    except (FileNotFoundError, ValueError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    pool = meta.get("cross_pool", 1)
    click.echo(f"wrote {out_file}: {1 - weight:g} x {base} + {weight:g} x {other}, pooling {pool}")


@distill.command()
@click.argument("draft")
@click.option(
    "--hf",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Output directory (new or empty).",
)
@click.option("--model", default=None, help="Target whose embeddings it borrows (default: the draft's own).")
def export(draft, out_dir, model):
    """Write DRAFT (a file or packaged:NAME) as a Hugging Face WhisperForCausalLM directory,
    which transformers' generate(assistant_model=...) accepts."""
    from specasr.models.hf_export import OFF_VOCAB, export_hf
    from specasr.models.loading import draft_path

    try:
        path = draft_path(draft)
        if path is None:
            raise ValueError(f"{draft!r} is not a distilled draft (a .safetensors file or packaged:NAME)")
        report = export_hf(path, model, out_dir)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    rows = (
        f"the other tokens score -{OFF_VOCAB:g}"
        if report.masked
        else "its final LayerNorm cannot mask the other tokens: they keep the target's rows"
    )
    click.echo(f"wrote {report.out}: {report.layers} layers, proposes {report.vocab} tokens; {rows}")
    if report.cross_pool > 1:
        click.echo(
            f"note: specasr's draft attends over means of {report.cross_pool} frames; the export attends "
            "over every frame (transformers has no pooled form): exact still, with its own acceptance rate"
        )
