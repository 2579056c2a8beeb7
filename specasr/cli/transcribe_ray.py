"""`specasr transcribe --ray`: files flow through Ray Data to actors that each load the
model pair once and transcribe with the local batch code (`transcribe.Batch.one`: locks,
provenance, --skip-existing, atomic outputs), writing into --output-dir themselves. The
driver loads no model: it adds up what each file came to and prints the local summary.
On several machines, the inputs and --output-dir must be at the same path on every node.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import sys
from collections.abc import Callable

import click

from specasr.cli.batch import Batch, output_stems
from specasr.cli.common import check_loaded
from specasr.eval.ray_runner import RayOptions, errors, map_actors, session, stopped


class _Transcriber:
    """A Ray Data actor: a `Batch` over the pair it loads once; one row per file with what
    became of it (done, skipped or failed), its messages, audio seconds and statistics."""

    def __init__(self, load: Callable, batch: Batch, threads: int | None) -> None:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        batch.pair = load()
        dec = batch.options.decode
        try:  # what only the loaded model can tell; the driver makes it a usage error
            check_loaded(batch.pair, dec.mode, dec.language, dec.task)
            self.unusable = None
        except click.UsageError as e:
            self.unusable = e.format_message()
        self.batch = batch

    def __call__(self, rows: dict) -> dict[str, list]:
        from specasr.stats import DecodeStats

        b, out = self.batch, {"counts": [], "messages": [], "audio_s": [], "stats": [], "unusable": []}
        for path, stem in zip(rows["path"], rows["stem"]):
            before = (b.done, b.skipped, b.failed, b.audio_s)
            b.total = DecodeStats()
            messages = io.StringIO()
            if self.unusable is None:
                with contextlib.redirect_stderr(messages):  # click.echo(err=True) writes here
                    b.one(str(path), str(stem), single=False, last_try=True)
            after = (b.done, b.skipped, b.failed, b.audio_s)
            out["counts"].append([x - y for x, y in zip(after[:3], before[:3])])
            out["audio_s"].append(after[3] - before[3])
            out["messages"].append(messages.getvalue())
            out["stats"].append(pickle.dumps(b.total))
            out["unusable"].append(self.unusable or "")
        return out


def run_on_ray(batch: Batch, files: list[str], load: Callable, options: RayOptions) -> None:
    """Transcribes `files` on Ray actors into `batch.output_dir`; adds their outcomes to
    `batch` (done, skipped, failed, audio, statistics) as they come back."""
    stems = output_stems(files)
    batch.clean_temps(stems)
    items = [{"path": f, "stem": s} for f, s in zip(files, stems)]
    kwargs = {"load": load, "batch": batch, "threads": options.threads}
    try:
        with session(options):
            for row in map_actors(items, _Transcriber, kwargs, options, batch_size=1):
                if row["unusable"]:
                    raise click.UsageError(row["unusable"])
                for name, n in zip(("done", "skipped", "failed"), row["counts"]):
                    setattr(batch, name, getattr(batch, name) + int(n))
                batch.audio_s += float(row["audio_s"])
                batch.total = batch.total.merge(pickle.loads(row["stats"]))
                if row["messages"]:
                    click.echo(row["messages"], err=True, nl=False)
    except ValueError as e:  # the cluster cannot place the workers
        raise click.UsageError(str(e)) from e
    except errors() as e:
        click.echo(f"error: {stopped(e)}", err=True)
        sys.exit(1)
