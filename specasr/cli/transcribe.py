"""`specasr transcribe`: files, directories and globs to transcripts and subtitle files.

Exit codes: 0 success, 1 some input failed (the others were still processed), 2 usage error
(found before any model is loaded where it can be), 130 interrupted (Ctrl-C; what was done
is summarised).

With --server URL the inputs go to a running `specasr serve` (`cli.remote`) and nothing here
loads a model or imports torch; the outputs, messages and exit codes are a local run's.

Output names: each input's path relative to the common parent folder of all inputs, without
its audio suffix (`A/x.wav B/x.wav -o out` -> out/A/x.txt, out/B/x.txt; one input -> out/x.txt).
The outputs' sources are recorded (`writers.provenance`), so --skip-existing skips only
outputs made from the same file, and a per-output lock keeps concurrent runs apart.
"""

from __future__ import annotations

import glob
import math
import os
import sys
import time
from pathlib import Path

import click
from click.core import ParameterSource

from specasr.cli.batch import Batch
from specasr.cli.common import (
    DEFAULTS,
    RayCommand,
    check_compute_type,
    check_device,
    check_model_options,
    gamma_options,
    load_models,
    model_options,
    pair_loader,
    prepare_output_dir,
    ray_options,
    ray_settings,
    threads_option,
)
from specasr.cli.decoding_options import check_suppress_tokens, whisper_options
from specasr.options import (
    DETECT_LANGUAGE,
    MAX_TEMPERATURE,
    MODES,
    SAMPLING_RULES,
    SEED_LIMIT,
    STRATEGIES,
    TranscribeOptions,
    VadOptions,
    front_end_options,
)
from specasr.writers import FORMATS, SubtitleOptions

_TRANSCRIBE = TranscribeOptions()
_AUDIO_SUFFIXES = {".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aac", ".webm", ".mp4", ".aiff", ".aif"}


def _expand_inputs(inputs: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Files, directories (searched recursively for audio files) and globs -> (files, unmatched)."""
    files, unmatched, seen = [], [], set()
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
            for f in found:  # one entry per file, however it was named (a.wav, ./a.wav)
                if (key := os.path.abspath(f)) not in seen:
                    seen.add(key)
                    files.append(f)
        else:
            unmatched.append(item)
    return files, unmatched


SERVER_TIMEOUT_S = 3600.0  # a server answers once the whole file is decoded, however long it is
# what a server fixes when it starts: given with --server, they would be silently ignored
_SERVER_FIXED = ("model", "draft", "device", "dtype", "compute_type", "ray_address", "workers")
_SERVER_FIXED += ("cpus_per_worker", "gpus_per_worker", "threads")


def _given(ctx: click.Context, name: str) -> bool:
    """Whether option `name` was given (on the command line or by its environment variable)."""
    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def _remote_settings(server: str | None, timeout: float | None) -> tuple[str, float] | None:
    """(URL, seconds per file) of --server and --timeout; None without --server. Usage
    errors (exit 2): a malformed URL, a model or Ray option given with --server, --api-key
    or --timeout without it."""
    ctx = click.get_current_context()
    if server is None:
        # $SPECASR_API_KEY may be set for every run; only a key on the command line is a mistake
        if timeout is not None or ctx.get_parameter_source("api_key") is ParameterSource.COMMANDLINE:
            raise click.UsageError("--api-key and --timeout go with --server")
        return None
    fixed = [p.opts[0] for p in ctx.command.params if p.name in _SERVER_FIXED and _given(ctx, p.name)]
    if fixed:
        raise click.UsageError(
            f"{', '.join(fixed)} cannot be used with --server: the server's models and devices are "
            "fixed when it starts (`specasr serve`)"
        )
    from specasr.cli.remote import server_url

    try:
        return server_url(server), SERVER_TIMEOUT_S if timeout is None else timeout
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--server'") from e


def _check_language(language: str | None) -> None:
    """A usage error (exit 2) for an unknown language code; what the server's models can do
    (English-only, no draft) only the server can tell, per file."""
    from specasr.tokenizer import LANGUAGES  # no torch

    if language is not None and language not in LANGUAGES:
        raise click.BadParameter(
            f"unknown language {language!r}; use a Whisper language code (en, de, fr, …) or 'auto'",
            param_hint="'--language'",
        )


def _connect(url: str, timeout: float, formats: list[str], task: str, api_key: str | None):
    """The client of the server at `url`, sending this command's options; exit 1 with one
    line when the server does not answer, before any file is read."""
    from specasr.cli.remote import Client, ServerError, form_fields

    ctx = click.get_current_context()
    given = {name: value for name, value in ctx.params.items() if _given(ctx, name)}
    client = Client(url, form_fields(given), formats, task=task, api_key=api_key, timeout=timeout)
    try:
        client.health()
    except ServerError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    return client


@click.command(cls=RayCommand)
@click.argument("inputs", nargs=-1, required=True)
@model_options
@gamma_options
@click.option("--mode", type=click.Choice(MODES), default=DEFAULTS.mode, show_default=True)
@click.option(
    "--temperature",
    type=click.FloatRange(0, MAX_TEMPERATURE),
    default=DEFAULTS.temperature,
    show_default=True,
    help="First temperature; windows that fail the quality checks retry at +0.2 steps up to 1.0.",
)
@click.option(
    "--sampling",
    type=click.Choice(SAMPLING_RULES),
    default=DEFAULTS.sampling,
    show_default=True,
    help="T > 0: coupled (every token the target's sample under noise keyed by position: the "
    "autoregressive transcript for the seed, in every mode) or rejection (Leviathan's rule).",
)
@click.option(
    "--language",
    default=DETECT_LANGUAGE,
    show_default=True,
    help="Language code, or 'auto': detected on each input's first 30 s (an English-only model: en).",
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
    help="Write <name>.<format> files here, mirroring the inputs' folders below their common "
    "parent (default: print to stdout).",
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
    help="sequential: Whisper's long-form loop; chunked: spans cut at pauses, decoded in batches (faster).",
)
@click.option(
    "--vad",
    is_flag=True,
    help="Decode only the speech found by Silero VAD (needs silero-vad); silence and noise give no text.",
)
@click.option(
    "--vad-threshold",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=VadOptions.threshold,
    show_default=True,
    help="With --vad: speech probability at which speech starts.",
)
@click.option(
    "--vad-min-silence",
    type=click.FloatRange(min=0),
    default=VadOptions.min_silence,
    show_default=True,
    help="With --vad: seconds of silence that end a speech chunk.",
)
@click.option("--seed", type=click.IntRange(0, SEED_LIMIT - 1), default=DEFAULTS.seed, show_default=True)
@click.option("--stats", is_flag=True, help="Print speculative-decoding statistics per file to stderr.")
@click.option(
    "--skip-existing",
    is_flag=True,
    help="Skip inputs whose outputs are all in --output-dir already, made from the same file "
    "(same path, size and modification time).",
)
@click.option(
    "--without-timestamps",
    is_flag=True,
    help="Decode text tokens only: no timestamp tokens, so a window's text is one segment (with "
    "--vad and the chunked strategy, one per packed window, as faster-whisper's batched "
    "pipeline gives). Fewer tokens to decode; --word-timestamps still times every word.",
)
@click.option(
    "--word-timestamps",
    is_flag=True,
    help="Time every word (cross-attention alignment): json and tsv list the words with their "
    "probability, and srt and vtt can lay them out (the next three options).",
)
@click.option(
    "--max-line-width",
    type=click.IntRange(min=1),
    default=None,
    help="srt/vtt with --word-timestamps: characters per line before a line break.",
)
@click.option(
    "--max-line-count",
    type=click.IntRange(min=1),
    default=None,
    help="srt/vtt with --word-timestamps and --max-line-width: lines per cue (words then flow "
    "across segments).",
)
@click.option(
    "--highlight-words",
    is_flag=True,
    help="srt/vtt with --word-timestamps: one cue per word, the spoken word underlined.",
)
@whisper_options
@threads_option
@click.option(
    "--verbose",
    is_flag=True,
    help="Print each segment to stderr as it is decoded: [start --> end] text.",
)
@ray_options
@click.option(
    "--server",
    metavar="URL",
    default=None,
    help="Send each input to a running `specasr serve` at URL (http://HOST:PORT) instead of loading "
    "models here: the same outputs, with the server's models.",
)
@click.option(
    "--api-key",
    envvar="SPECASR_API_KEY",
    default=None,
    help="With --server: the server's API key (default: $SPECASR_API_KEY).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help=f"With --server: seconds to wait for the server's answer for each file [{SERVER_TIMEOUT_S:g}].",
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
    sampling,
    language,
    task,
    formats,
    output_dir,
    device,
    dtype,
    compute_type,
    batch_size,
    strategy,
    vad,
    vad_threshold,
    vad_min_silence,
    seed,
    stats,
    skip_existing,
    without_timestamps,
    word_timestamps,
    max_line_width,
    max_line_count,
    highlight_words,
    ray_address,
    workers,
    cpus_per_worker,
    gpus_per_worker,
    server,
    api_key,
    timeout,
    threads,
    verbose,
    **decoding,  # whisper_options' values, by WHISPER_DEFAULTS' names
):
    """Transcribe audio INPUTS (files, directories, globs) of any length.

    With one input and no --output-dir the transcript goes to stdout; several inputs print
    "path: text" lines. Exit status 1 if any input failed (the others are still done), 2 for
    a usage error (before any model is loaded), 130 when interrupted.
    """
    started = time.time()  # outputs written after this by another run are never overwritten
    remote = _remote_settings(server, timeout)
    check_suppress_tokens(decoding["suppress_tokens"])
    if math.isnan(temperature):  # (a range passes NaN)
        raise click.BadParameter("nan: must be a number from 0 to 1", param_hint="'--temperature'")
    try:
        options = front_end_options(
            mode=mode,
            temperature=temperature,
            gamma=gamma,
            gamma_policy=gamma_policy,
            draft_stop=draft_stop,
            sampling=sampling,
            language=language,
            task=task,
            seed=seed,
            timing=stats,  # --stats prints the phase times
            without_timestamps=without_timestamps,
            strategy=strategy,
            vad=vad,
            vad_threshold=vad_threshold,
            vad_min_silence=vad_min_silence,
            batch_size=batch_size,
            word_timestamps=word_timestamps,
            **decoding,
        )
        decode = options.decode
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    if not word_timestamps and (max_line_width or max_line_count or highlight_words):
        raise click.UsageError(
            "--max-line-width, --max-line-count and --highlight-words need --word-timestamps"
        )
    if max_line_count is not None and max_line_width is None:
        raise click.UsageError("--max-line-count needs --max-line-width")
    formats = list(FORMATS) if "all" in formats else list(dict.fromkeys(formats))
    files, unmatched = _expand_inputs(inputs)
    if output_dir is None:
        if skip_existing:
            raise click.UsageError("--skip-existing needs --output-dir")
        if len(inputs) == 1 and len(files) <= 1 and len(formats) > 1:
            raise click.UsageError("several formats need --output-dir")
        if (len(inputs) > 1 or len(files) > 1) and formats != ["txt"]:
            raise click.UsageError("several inputs print plain text; use --output-dir for other formats")
    ray = ray_settings(ray_address, workers, cpus_per_worker, gpus_per_worker)
    if ray is not None and output_dir is None:
        raise click.UsageError("--ray writes files: give --output-dir")
    if remote is None:
        check_model_options(model, draft, mode, decode.language, task)
        check_compute_type(compute_type, mode)
    else:
        _check_language(decode.language)
    if output_dir is not None:
        prepare_output_dir(output_dir)
    if ray is None and remote is None:
        check_device(device)  # imports torch for cuda/mps/xpu, so after the cheap checks
    client = pair = batch = None
    try:
        if remote is not None:
            client = _connect(*remote, formats, task, api_key)
        elif ray is None:
            pair = load_models(model, draft, mode, device, dtype, compute_type, threads=threads)
        for item in unmatched:
            click.echo(f"error: {item}: no such file, or no audio files match", err=True)
        batch = Batch(
            pair,
            options,
            formats,
            output_dir,
            skip_existing,
            stats,
            n_inputs=len(files) + len(unmatched),
            remote=client,
        )
        batch.started = started
        batch.subtitles = SubtitleOptions(max_line_width, max_line_count, highlight_words)
        batch.verbose = verbose
        batch.failed += len(unmatched)
        if ray is None:
            batch.run(files)
        else:  # Ray actors load the models and write the outputs (cli/transcribe_ray.py)
            from specasr.cli.transcribe_ray import run_on_ray

            run_on_ray(
                batch, files, pair_loader(model, draft, mode, device or ray.device, dtype, compute_type), ray
            )
    except KeyboardInterrupt:
        if batch is None:
            click.echo("interrupted before any file was transcribed", err=True)
        else:
            click.echo(f"interrupted: {batch.summary()}", err=True)
            if batch.failed:
                click.echo(f"{batch.failed} of {batch.n_inputs} file(s) failed", err=True)
        sys.exit(130)
    click.echo(batch.summary(), err=True)
    if batch.failed:
        click.echo(f"{batch.failed} of {batch.n_inputs} file(s) failed", err=True)
        sys.exit(1)
