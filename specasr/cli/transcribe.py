"""`specasr transcribe`: files, directories and globs to transcripts and subtitle files.

Exit codes: 0 success, 1 some input failed (the others were still processed), 2 usage error.
"""

from __future__ import annotations

import glob
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from specasr.cli.common import DEFAULTS, gamma_options, load_models, model_options
from specasr.options import MODES, STRATEGIES, TranscribeOptions, fallback_schedule
from specasr.writers import FORMATS

_TRANSCRIBE = TranscribeOptions()
_AUDIO_SUFFIXES = {".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aac", ".webm", ".mp4", ".aiff", ".aif"}


def _expand_inputs(inputs: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Files, directories (searched recursively for audio files) and globs -> (files, unmatched)."""
    files, unmatched = [], []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(
                str(p) for p in path.rglob("*") if p.is_file() and p.suffix.lower() in _AUDIO_SUFFIXES
            )
        elif path.exists():
            found = [item]
        else:
            found = sorted(p for p in glob.glob(item, recursive=True) if Path(p).is_file())
        if found:
            files += [f for f in found if f not in files]
        else:
            unmatched.append(item)
    return files, unmatched


def _output_stems(files: list[str]) -> list[str]:
    """Output name per input: its stem, made unique with -2, -3 … when stems collide."""
    seen: dict[str, int] = {}
    stems = []
    for f in files:
        stem = Path(f).stem
        seen[stem] = seen.get(stem, 0) + 1
        stems.append(stem if seen[stem] == 1 else f"{stem}-{seen[stem]}")
    return stems


@click.command()
@click.argument("inputs", nargs=-1, required=True)
@model_options
@gamma_options
@click.option("--mode", type=click.Choice(MODES), default=DEFAULTS.mode, show_default=True)
@click.option(
    "--temperature",
    type=float,
    default=DEFAULTS.temperature,
    show_default=True,
    help="First temperature; windows that fail the quality checks retry at +0.2 steps up to 1.0.",
)
@click.option(
    "--language", default=DEFAULTS.language, show_default=True, help="Language code; 'auto' to detect."
)
@click.option(
    "--task", type=click.Choice(["transcribe", "translate"]), default=DEFAULTS.task, show_default=True
)
@click.option(
    "--format",
    "formats",
    type=click.Choice([*FORMATS, "all"]),
    multiple=True,
    default=["txt"],
    show_default=True,
    help="Output format; repeat for several, or 'all'.",
)
@click.option(
    "--output-dir",
    "-o",
    type=click.Path(file_okay=False, path_type=str),
    default=None,
    help="Write <name>.<format> files here (default: print to stdout).",
)
@click.option(
    "--batch-size",
    type=int,
    default=_TRANSCRIBE.batch_size,
    show_default=True,
    help="Windows per batch (chunked strategy).",
)
@click.option(
    "--strategy",
    type=click.Choice(STRATEGIES),
    default=_TRANSCRIBE.strategy,
    show_default=True,
    help="sequential: Whisper's long-form loop; chunked: overlapping windows in batches (faster).",
)
@click.option("--seed", type=int, default=DEFAULTS.seed, show_default=True)
@click.option("--stats", is_flag=True, help="Print speculative-decoding statistics per file to stderr.")
@click.option(
    "--skip-existing", is_flag=True, help="Skip inputs whose outputs are all in --output-dir already."
)
def transcribe(
    inputs,
    model,
    draft,
    mode,
    gamma,
    gamma_policy,
    draft_stop,
    temperature,
    language,
    task,
    formats,
    output_dir,
    device,
    dtype,
    batch_size,
    strategy,
    seed,
    stats,
    skip_existing,
):
    """Transcribe audio INPUTS (files, directories, globs) of any length.

    With one input and no --output-dir the transcript goes to stdout; several inputs print
    "path: text" lines. Exit status 1 if any input failed (the others are still done).
    """
    try:
        decode = replace(
            _TRANSCRIBE.decode,
            mode=mode,
            temperature=temperature,  # the start of the fallback schedule below
            gamma=gamma,
            gamma_policy=gamma_policy,
            draft_stop=draft_stop,
            language=None if language == "auto" else language,
            task=task,
            seed=seed,
            gamma_max=max(DEFAULTS.gamma_max, gamma),
            timing=stats,  # --stats prints the phase times
        )
        options = replace(
            _TRANSCRIBE,
            decode=decode,
            strategy=strategy,
            batch_size=batch_size,
            temperatures=fallback_schedule(temperature),
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    formats = list(FORMATS) if "all" in formats else list(dict.fromkeys(formats))
    files, unmatched = _expand_inputs(inputs)
    if output_dir is None:
        if skip_existing:
            raise click.UsageError("--skip-existing needs --output-dir")
        if len(inputs) == 1 and len(files) <= 1 and len(formats) > 1:
            raise click.UsageError("several formats need --output-dir")
        if (len(inputs) > 1 or len(files) > 1) and formats != ["txt"]:
            raise click.UsageError("several inputs print plain text; use --output-dir for other formats")
    pair = load_models(model, draft, mode, device, dtype)
    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
    for item in unmatched:
        click.echo(f"error: {item}: no such file, or no audio files match", err=True)
    batch = _Batch(
        pair, options, formats, output_dir, skip_existing, stats, n_inputs=len(files) + len(unmatched)
    )
    batch.run(files)
    batch.failed += len(unmatched)
    click.echo(batch.summary(), err=True)
    if batch.failed:
        click.echo(f"{batch.failed} of {batch.n_inputs} file(s) failed", err=True)
        sys.exit(1)


class _Batch:
    """Transcribes files one by one; failures are reported and counted, never raised."""

    def __init__(self, pair, options, formats, output_dir, skip_existing, stats, n_inputs) -> None:
        from specasr.decode.stats import DecodeStats

        self.pair, self.options, self.formats = pair, options, formats
        self.output_dir, self.skip_existing, self.show_stats = output_dir, skip_existing, stats
        self.n_inputs = n_inputs
        self.done = self.failed = self.skipped = 0
        self.audio_s = 0.0
        self.total = DecodeStats()
        self.quiet = not sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def run(self, files: list[str]) -> None:
        from tqdm import tqdm

        stems = _output_stems(files)
        with tqdm(total=len(files), desc="files", unit="file", disable=self.quiet, position=0) as bar:
            for path, stem in zip(files, stems):
                self.one(path, stem, single=self.n_inputs == 1)
                bar.update(1)

    def one(self, path: str, stem: str, single: bool) -> None:
        from tqdm import tqdm

        from specasr import writers
        from specasr.transcription import transcribe

        if self.output_dir is not None and self.skip_existing:
            if all(p.is_file() for p in writers.output_paths(stem, self.output_dir, self.formats).values()):
                self.skipped += 1
                return
        try:
            segments, info = transcribe(path, self.pair, self.options)
            done = []
            with tqdm(
                total=round(info.duration, 1), desc=Path(path).name, unit="s", leave=False, disable=self.quiet
            ) as bar:
                for seg in segments:
                    done.append(seg)
                    bar.update(round(seg.end, 1) - bar.n)
            if self.output_dir is not None:
                writers.write(done, info, stem, self.output_dir, self.formats)
            elif single:
                click.echo(writers.RENDERERS[self.formats[0]](done, info), nl=False)
            else:
                click.echo(f"{path}: " + " ".join(s.text.strip() for s in done))
        except Exception as e:  # a batch reports the file and goes on, whatever went wrong
            self.failed += 1
            click.echo(f"error: {path}: {e}" if str(path) not in str(e) else f"error: {e}", err=True)
            return
        self.done += 1
        self.audio_s += info.duration
        self.total = self.total.merge(info.stats)
        if self.show_stats:
            click.echo(f"[{path}] {info.stats.summary()}", err=True)

    def summary(self) -> str:
        wall = time.perf_counter() - self.t0
        rtf = wall / self.audio_s if self.audio_s else 0.0
        t = self.total
        alpha = "n/a"
        if t.proposed:
            alpha = f"{t.token_acceptance:.3f} (accepted/proposed {t.acceptance_rate:.3f})"
        return (
            f"files: {self.done} done, {self.skipped} skipped, {self.failed} failed; "
            f"audio {self.audio_s:.1f} s, wall {wall:.1f} s, real-time factor {rtf:.3f}, "
            f"α̂ per token {alpha}"
        )
