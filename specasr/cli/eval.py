"""`specasr eval`: WER and speculative-decoding metrics of a dataset, per decoding mode."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import click

from specasr.cli.common import (
    DEFAULTS,
    RayCommand,
    check_compute_type,
    gamma_options,
    load_models,
    model_options,
    pair_loader,
    ray_options,
    ray_settings,
)
from specasr.options import MODES


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
    from specasr.eval.report import PLOT, SUMMARY, TABLE, write_reports

    summary = write_reports(output_dir, config, records)
    out = Path(output_dir)
    click.echo((out / TABLE).read_text(), err=False)
    click.echo(f"wrote {out / 'results.jsonl'}, {out / SUMMARY}, {out / TABLE}", err=True)
    if not summary["plot"]:
        click.echo(f"no {out / PLOT}: the plot needs matplotlib (pip install matplotlib)", err=True)
    return summary


def _fail(error: Exception | str) -> NoReturn:
    """A dataset definition or output directory that cannot be used: a message, exit 2."""
    click.echo(f"error: {error}", err=True)
    sys.exit(2)


def _interrupted(output_dir: str, evaluator) -> NoReturn:
    """Ctrl-C: says what is done, reports it, exits 130 (128 + SIGINT)."""
    from specasr.eval.runner import CONFIG, merge

    if evaluator is None or evaluator.total == 0 or not (Path(output_dir) / CONFIG).is_file():
        click.echo("interrupted before decoding began; nothing was decoded", err=True)
        sys.exit(130)
    e = evaluator
    click.echo(
        f"interrupted: {e.done} of {e.total} decodes done ({e.written} written by this run"
        + (f", {e.failed} failed" if e.failed else "")
        + f"); {output_dir} keeps them: rerun the same command to resume",
        err=True,
    )
    _eval_report(output_dir, *merge([output_dir]))
    sys.exit(130)


@click.command(name="eval", cls=RayCommand)
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
@click.option(
    "--modes",
    multiple=True,
    default=[",".join(MODES)],
    show_default=True,
    help="Comma-separated (or repeated) decoding modes.",
)
@click.option("--temperature", type=float, default=DEFAULTS.temperature, show_default=True)
@model_options
@gamma_options
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
@ray_options
@click.option("--audio-column", default=None, help="datasets: the audio column [audio].")
@click.option("--text-column", default=None, help="datasets: the reference text column [text].")
@click.option("--split", default=None, help="datasets: the split, where there are several [test].")
def eval_(name, merge_dirs, data_dir, download, cache_dir, model, draft, modes, temperature, gamma,
          gamma_policy, draft_stop, max_new_tokens, paper, limit, fraction, seed, batch_size, output_dir,
          shard, device, dtype, compute_type, ray_address, workers, cpus_per_worker, gpus_per_worker,
          audio_column, text_column, split):  # fmt: skip
    """WER and speculative-decoding metrics of dataset NAME, per mode.

    NAME: librispeech-clean, librispeech-other, tedlium3, cv16-en, manifest (--data-dir is
    then a jsonl/csv file), or datasets (--data-dir: a Hugging Face dataset saved with
    save_to_disk, parquet files, or a hub id). `specasr eval merge DIR... -o OUT` merges
    shard outputs into OUT. Reruns with the same --output-dir resume, with or without --ray
    (then Ray actors decode, --workers of them, --batch-size utterances per call).

    Exit status 2, before any model is loaded, for a bad option, a data directory or
    manifest that cannot be read (the file and line are named), or an --output-dir whose
    results.jsonl does not read back or that holds another run (a different draft or dtype
    shows once the models are loaded). An utterance whose audio cannot be read or decoded
    (a span past the end of its file, say) is recorded as failed and the run goes on; exit
    status 1 then. On Ctrl-C what is done is said, kept and reported (exit status 130);
    rerun to resume.
    """
    from specasr.eval.runner import (
        EvalOptions,
        Evaluator,
        ResultsError,
        check_output_dir,
        merge,
        pair_meta,
        paper_options,
        select,
    )
    from specasr.recipes import DATASETS, DatasetError, DownloadError

    if name == "merge":
        if not merge_dirs or output_dir is None:
            raise click.UsageError("usage: specasr eval merge DIR... --output-dir OUT")
        try:
            config, records = merge(merge_dirs)
        except ResultsError as e:
            _fail(e)
        except ValueError as e:
            raise click.UsageError(str(e)) from e
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        from specasr.eval.runner import CONFIG, RESULTS
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
    columns = {"audio_column": audio_column, "text_column": text_column, "split": split}
    columns = {k: v for k, v in columns.items() if v is not None}
    if columns and name != "datasets":
        raise click.UsageError("--audio-column, --text-column and --split go with the datasets source")
    ray = ray_settings(ray_address, workers, cpus_per_worker, gpus_per_worker)
    try:
        decode = replace(
            DEFAULTS,
            temperature=temperature,
            gamma=gamma,
            gamma_policy=gamma_policy,
            draft_stop=draft_stop,
            gamma_max=max(DEFAULTS.gamma_max, gamma),
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
    check_compute_type(compute_type, options.modes)
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
        utts = select(recipe.load(data_dir, **columns), options)
    except DatasetError as e:  # the dataset's definition itself: nothing is decoded
        _fail(e)
    except OSError as e:  # an unreadable transcript or listing
        _fail(f"cannot read the dataset: {e}")
    output_dir = output_dir or f"eval-{name}"
    meta = {"dataset": name, "model": model} | options.config()
    try:  # a resumed run's directory, before the models load
        check_output_dir(output_dir, meta)
    except ResultsError as e:
        _fail(e)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    ray_errors: tuple[type[Exception], ...] = ()
    if ray is not None:
        from specasr.eval.ray_runner import RayEvaluator, errors, session, stopped

        ray_errors = errors()
    mode = "exact" if any(m != "autoregressive" for m in options.modes) else "autoregressive"
    evaluator = None
    try:
        # a dataset run: the fp16-packed decoder forms' packing time pays back
        if ray is None:
            pair = load_models(model, draft, mode, device, dtype, compute_type, half_weights=True)
            meta = {"dataset": name, "model": model} | pair_meta(pair, options.modes)
            evaluator = Evaluator(pair, options, output_dir, meta)
        else:  # the actors load the models
            load = pair_loader(
                model, draft, mode, device or ray.device, dtype, compute_type, half_weights=True
            )
            evaluator = RayEvaluator(load, options, output_dir, {"dataset": name, "model": model}, ray)
        where = "" if ray is None else f" on Ray ({ray.workers} worker(s))"
        click.echo(
            f"{name}: {len(utts)} utterances, modes {', '.join(options.modes)}{where} -> {output_dir}",
            err=True,
        )
        with session(ray) if ray is not None else nullcontext():
            records = evaluator.run(utts)
    except ResultsError as e:
        _fail(e)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    except ray_errors as e:  # an actor that could not start or load the models, a lost node …
        click.echo(f"error: {stopped(e)}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        _interrupted(output_dir, evaluator)
    _eval_report(output_dir, evaluator.meta, records)
    if evaluator.failed:
        click.echo(f"{evaluator.failed} decode(s) failed (see the error field in results.jsonl)", err=True)
        sys.exit(1)
