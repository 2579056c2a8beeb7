"""`specasr` command line: a thin click front end over the library.

Exit codes: 0 success, 1 some input failed (the others were still processed), 2 usage error.
"""

from __future__ import annotations

import glob
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from specasr.options import GAMMA_POLICIES, MODES, STRATEGIES, DecodeOptions, TranscribeOptions
from specasr.writers import FORMATS

_DEFAULTS = DecodeOptions()


def _load(model: str, draft: str | None, mode: str, device: str | None, dtype: str | None):
    import torch

    from specasr.models import load_pair

    torch_dtype = {None: None, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    want_draft = None if mode == "autoregressive" and draft in (None, "default") else (draft or "default")
    return load_pair(model, want_draft, device=device, dtype=torch_dtype)


@click.group()
@click.version_option(package_name="specasr")
def main() -> None:
    """Whisper transcription with exact speculative decoding."""


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


def _fallback_schedule(temperature: float) -> tuple[float, ...]:
    """The starting temperature, then +0.2 steps up to 1.0 (Whisper's fallback schedule)."""
    steps = [temperature]
    while steps[-1] + 0.2 <= 1.0 + 1e-9:
        steps.append(round(steps[-1] + 0.2, 6))
    return tuple(steps)


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option(
    "--model",
    default="base",
    show_default=True,
    help="Target: preset, HF hub id, HF or CTranslate2 directory.",
)
@click.option(
    "--draft",
    default="default",
    show_default=True,
    help="Draft: 'default' (the preset's), 'none', 'self:K' (first K target layers), or a model spec.",
)
@click.option("--mode", type=click.Choice(MODES), default=_DEFAULTS.mode, show_default=True)
@click.option(
    "--gamma",
    type=int,
    default=_DEFAULTS.gamma,
    show_default=True,
    help="Draft tokens per step (start value).",
)
@click.option(
    "--gamma-policy", type=click.Choice(GAMMA_POLICIES), default=_DEFAULTS.gamma_policy, show_default=True
)
@click.option(
    "--temperature",
    type=float,
    default=_DEFAULTS.temperature,
    show_default=True,
    help="First temperature; windows that fail the quality checks retry at +0.2 steps up to 1.0.",
)
@click.option(
    "--language", default=_DEFAULTS.language, show_default=True, help="Language code; 'auto' to detect."
)
@click.option(
    "--task", type=click.Choice(["transcribe", "translate"]), default=_DEFAULTS.task, show_default=True
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
@click.option("--device", default=None, help="cpu, cuda, cuda:1 … (default: cuda when available).")
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "fp16", "bf16"]),
    default=None,
    help="Model dtype (default: fp32 on CPU, fp16 on CUDA).",
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
@click.option("--seed", type=int, default=_DEFAULTS.seed, show_default=True)
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
            gamma=gamma,
            gamma_policy=gamma_policy,
            language=None if language == "auto" else language,
            task=task,
            seed=seed,
            gamma_max=max(_DEFAULTS.gamma_max, gamma),
        )
        options = replace(
            _TRANSCRIBE,
            decode=decode,
            strategy=strategy,
            batch_size=batch_size,
            temperatures=_fallback_schedule(temperature),
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
    try:
        pair = _load(model, draft, mode, device, dtype)
    except (ValueError, FileNotFoundError, OSError) as e:
        click.echo(f"error: cannot load model: {e}", err=True)
        sys.exit(1)
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
        from specasr.stats import DecodeStats

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
        from specasr.transcribe import transcribe

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
        alpha = f"{self.total.acceptance_rate:.3f}" if self.total.proposed else "n/a"
        return (
            f"files: {self.done} done, {self.skipped} skipped, {self.failed} failed; "
            f"audio {self.audio_s:.1f} s, wall {wall:.1f} s, real-time factor {rtf:.3f}, "
            f"acceptance rate {alpha}"
        )


@main.command()
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=str))
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option(
    "--mode",
    "modes",
    type=click.Choice(MODES[1:]),
    multiple=True,
    default=[_DEFAULTS.mode],
    show_default=True,
    help="Verifier mode; repeat to compare several against one autoregressive reference.",
)
@click.option("--gamma", type=int, default=_DEFAULTS.gamma, show_default=True)
@click.option(
    "--gamma-policy", type=click.Choice(GAMMA_POLICIES), default=_DEFAULTS.gamma_policy, show_default=True
)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option(
    "--mels",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A torch.save'd list of [1, n_mels, 3000] windows to use instead of FILES.",
)
@click.option("--device", default=None)
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default=None)
@click.option(
    "--dump-logits",
    type=click.Path(dir_okay=False),
    default=None,
    help="Instead of timing, save paired target/draft logits along the greedy transcripts.",
)
def bench(
    files, model, draft, modes, gamma, gamma_policy, temperature, repeats, mels, device, dtype, dump_logits
):
    """Speculative vs autoregressive decoding on FILES (default: the bundled example), interleaved."""
    from importlib.resources import files as resources

    import torch

    from specasr.bench import file_mels, logit_pairs, run_bench

    pair = _load(model, draft, modes[0], device, dtype)
    if mels:
        windows = [m.to(pair.device) for m in torch.load(mels)]
    else:
        windows = file_mels(pair, list(files) or [str(resources("specasr") / "assets" / "example.wav")])
    if dump_logits:
        torch.save(logit_pairs(pair, windows, _DEFAULTS), dump_logits)
        click.echo(f"saved paired logits to {dump_logits}")
        return
    for mode in modes:
        options = replace(
            _DEFAULTS,
            mode=mode,
            gamma=gamma,
            gamma_policy=gamma_policy,
            temperature=temperature,
            gamma_max=max(_DEFAULTS.gamma_max, gamma),
        )
        report = run_bench(pair, windows, options, repeats=repeats)
        click.echo(
            f"\nmodel {model}, draft {pair.draft_name}, mode {mode}, γ {gamma} ({gamma_policy}), "
            f"T {temperature}, device {pair.device}, dtype {str(pair.dtype).removeprefix('torch.')}"
        )
        click.echo(report.table())


@main.command()
def models() -> None:
    """List the model presets and whether each is available locally."""
    from specasr.models import list_presets

    rows = list_presets()
    click.echo(f"{'preset':<10} {'local':<6} {'target':<28} draft")
    for row in rows:
        local = "yes" if row["available_locally"] else "no"
        click.echo(f"{row['name']:<10} {local:<6} {row['target']:<28} {row['draft']}")


def _parse_shard(value: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise click.BadParameter(f"expected I/N, e.g. 0/4, got {value!r}") from None
    if not 0 <= i < n:
        raise click.BadParameter(f"need 0 <= I < N, got {value}")
    return i, n


def _parse_modes(values: tuple[str, ...]) -> tuple[str, ...]:
    modes = tuple(dict.fromkeys(m.strip() for v in values for m in v.split(",") if m.strip()))
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise click.BadParameter(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    return modes


def _eval_report(output_dir: str, config: dict, records: list[dict]) -> dict:
    from specasr.eval_report import PLOT, SUMMARY, TABLE, write_reports

    summary = write_reports(output_dir, config, records)
    out = Path(output_dir)
    click.echo((out / TABLE).read_text(), err=False)
    click.echo(f"wrote {out / 'results.jsonl'}, {out / SUMMARY}, {out / TABLE}", err=True)
    if not summary["plot"]:
        click.echo(f"no {out / PLOT}: the plot needs matplotlib (pip install matplotlib)", err=True)
    return summary


@main.command(name="eval")
@click.argument("name")
@click.argument("merge_dirs", nargs=-1)
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="The dataset's directory.")
@click.option("--download", is_flag=True, help="Fetch the dataset into --cache-dir (LibriSpeech, TED-LIUM).")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path.home() / ".cache" / "specasr" / "datasets",
    show_default=True,
)
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True, help="As for `transcribe`.")
@click.option(
    "--modes",
    multiple=True,
    default=[",".join(MODES)],
    show_default=True,
    help="Comma-separated (or repeated) decoding modes.",
)
@click.option("--temperature", type=float, default=_DEFAULTS.temperature, show_default=True)
@click.option("--gamma", type=int, default=_DEFAULTS.gamma, show_default=True)
@click.option(
    "--gamma-policy", type=click.Choice(GAMMA_POLICIES), default=_DEFAULTS.gamma_policy, show_default=True
)
@click.option(
    "--max-new-tokens", type=int, default=None, help="Token limit per utterance (default: 448 context)."
)
@click.option(
    "--paper",
    is_flag=True,
    help="The paper's setting: T=1.0, adaptive γ from 5, batch 1, 256 tokens, sigmoid ±1e3.",
)
@click.option("--limit", type=int, default=None, help="Only the first N utterances (by id).")
@click.option(
    "--fraction", type=float, default=None, help="A random fraction of the utterances (see --seed)."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds --fraction and sampling.")
@click.option("--batch-size", type=int, default=1, show_default=True)
@click.option(
    "--output-dir",
    "-o",
    type=click.Path(file_okay=False, path_type=str),
    default=None,
    help="Default: ./eval-NAME.",
)
@click.option(
    "--shard", default="0/1", show_default=True, help="I/N: this process takes every N-th utterance."
)
@click.option("--device", default=None)
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default=None)
def eval_(name, merge_dirs, data_dir, download, cache_dir, model, draft, modes, temperature, gamma,
          gamma_policy, max_new_tokens, paper, limit, fraction, seed, batch_size, output_dir, shard,
          device, dtype):  # fmt: skip
    """WER and speculative-decoding metrics of dataset NAME, per mode.

    NAME: librispeech-clean, librispeech-other, tedlium3, cv16-en, or manifest (--data-dir is
    then a jsonl/csv file). `specasr eval merge DIR... -o OUT` merges shard outputs into OUT.
    Reruns with the same --output-dir resume. Exit status 1 if any utterance failed.
    """
    from specasr.evaluate import EvalOptions, Evaluator, merge, paper_options, select
    from specasr.recipes import DATASETS, DatasetError, DownloadError

    if name == "merge":
        if not merge_dirs or output_dir is None:
            raise click.UsageError("usage: specasr eval merge DIR... --output-dir OUT")
        try:
            config, records = merge(merge_dirs)
        except ValueError as e:
            raise click.UsageError(str(e)) from e
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        from specasr.evaluate import CONFIG, RESULTS
        from specasr.writers import write_atomic

        write_atomic(Path(output_dir) / CONFIG, json.dumps(config, indent=1) + "\n")
        write_atomic(
            Path(output_dir) / RESULTS, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        )
        _eval_report(output_dir, config, records)
        return
    if merge_dirs:
        raise click.UsageError(f"unexpected arguments {' '.join(merge_dirs)}")
    if name not in DATASETS:
        raise click.UsageError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)} (or merge)")
    recipe = DATASETS[name]
    try:
        decode = replace(
            _DEFAULTS,
            temperature=temperature,
            gamma=gamma,
            gamma_policy=gamma_policy,
            gamma_max=max(_DEFAULTS.gamma_max, gamma),
            max_new_tokens=max_new_tokens,
            seed=seed,
        )
        options = EvalOptions(
            modes=_parse_modes(modes),
            decode=decode,
            batch_size=batch_size,
            limit=limit,
            fraction=fraction,
            seed=seed,
            shard=_parse_shard(shard),
        )
        options = paper_options(options) if paper else options
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    if download:
        if recipe.download is None:
            raise click.UsageError(f"{name} has no download; give --data-dir")
        try:
            data_dir = recipe.download(cache_dir)
        except DownloadError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
    if data_dir is None:
        raise click.UsageError("give --data-dir (or --download for LibriSpeech and TED-LIUM)")
    try:
        utts = select(recipe.load(data_dir), options)
    except DatasetError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    speculative = any(m != "autoregressive" for m in options.modes)
    try:
        pair = _load(model, draft, "exact" if speculative else "autoregressive", device, dtype)
    except (ValueError, FileNotFoundError, OSError) as e:
        click.echo(f"error: cannot load model: {e}", err=True)
        sys.exit(1)
    output_dir = output_dir or f"eval-{name}"
    meta = {"dataset": name, "model": model, "draft": pair.draft_name if speculative else None}
    meta |= {"device": str(pair.device), "dtype": str(pair.dtype).removeprefix("torch.")}
    evaluator = Evaluator(pair, options, output_dir, meta)
    click.echo(f"{name}: {len(utts)} utterances, modes {', '.join(options.modes)} -> {output_dir}", err=True)
    try:
        records = evaluator.run(utts)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    except KeyboardInterrupt:
        click.echo(f"interrupted: {output_dir} holds what is done; rerun the command to resume", err=True)
        _eval_report(output_dir, *merge([output_dir]))
        sys.exit(130)
    _eval_report(output_dir, evaluator.meta, records)
    if evaluator.failed:
        click.echo(f"{evaluator.failed} decode(s) failed (see the error field in results.jsonl)", err=True)
        sys.exit(1)
