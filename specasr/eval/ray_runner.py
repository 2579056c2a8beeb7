"""Eval and batch transcription on Ray: work items flow through Ray Data to actors that
each load the model pair once.

The driver decides what is left to do, with the local runner's own resume code
(`Evaluator._resume`), and builds `ray.data.from_items(items).map_batches(ActorClass,
compute=ActorPoolStrategy(size=workers))`. An actor's `__init__` loads the pair; its
`__call__` decodes a batch with the local code (`Evaluator.groups` and `_decode`) and returns
json records. They stream back to the driver, which alone appends them to results.jsonl
(`Evaluator._append`): resume, per-utterance failures and the reports are the local run's.

Ray is imported only inside these functions: `specasr[ray]` is an optional extra. On a
cluster of several machines every node needs specasr installed and the audio at the same
path (a shared filesystem); a Hugging Face `datasets` source sends the audio bytes along.
"""

from __future__ import annotations

import json
import logging
import pickle
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specasr.eval.runner import EvalOptions, Evaluator, _comparable, pair_meta, read_config

INSTALL = "pip install 'specasr[ray]'"


@dataclass(frozen=True)
class RayOptions:
    address: str = "local"  # "local": start a Ray on this machine; "auto" or HOST:PORT: join a cluster
    workers: int = 1  # actors, each with its own model pair
    cpus_per_worker: float = 1.0  # CPUs Ray reserves per actor; on a CPU also torch's thread count
    gpus_per_worker: float = 0.0  # GPUs per actor (a fraction shares one); > 0 decodes on CUDA

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if not self.cpus_per_worker > 0:
            raise ValueError(f"cpus_per_worker must be > 0, got {self.cpus_per_worker}")
        if self.gpus_per_worker < 0:
            raise ValueError(f"gpus_per_worker must be >= 0, got {self.gpus_per_worker}")

    @property
    def device(self) -> str:
        """The actors' default device: a Ray actor sees only the GPUs it was given."""
        return "cuda" if self.gpus_per_worker > 0 else "cpu"

    @property
    def threads(self) -> int | None:
        """torch threads per CPU actor: its whole reserved CPUs, at least one."""
        return None if self.gpus_per_worker > 0 else max(1, int(self.cpus_per_worker))


@contextmanager
def session(options: RayOptions) -> Iterator[None]:
    """Ray for the block: joins `options.address`, or starts a local Ray ("local"), or uses
    the one this process already joined (which it leaves running). Raises ValueError when
    the cluster has fewer CPUs or GPUs than `workers` actors ask for (they would wait
    forever)."""
    import ray

    started = not ray.is_initialized()
    if started:
        local = options.address == "local"
        ray.init(
            address=None if local else options.address,
            logging_level=logging.WARNING,
            **({"include_dashboard": False} if local else {}),
        )
    try:
        import ray.data

        logging.getLogger("ray.data").setLevel(logging.WARNING)
        ray.data.DataContext.get_current().enable_progress_bars = sys.stderr.isatty()
        have = ray.cluster_resources()
        for kind, each in (("CPU", options.cpus_per_worker), ("GPU", options.gpus_per_worker)):
            if options.workers * each > have.get(kind, 0):
                raise ValueError(
                    f"{options.workers} worker(s) × {each:g} {kind}(s) each, but the Ray cluster has "
                    f"{have.get(kind, 0):g} {kind}(s); use fewer --workers or a smaller "
                    f"--{kind.lower()}s-per-worker"
                )
        yield
    finally:
        if started:
            ray.shutdown()


def errors() -> tuple[type[Exception], ...]:
    """What a Ray run raises when an actor cannot start (a model that does not load) or
    dies, or a node is lost: the run stops there, and a rerun resumes."""
    import ray.exceptions

    return (ray.exceptions.RayError,)


def stopped(error: Exception) -> str:
    """A Ray error in one line: the last line of the worker's traceback."""
    lines = str(error).strip().splitlines()
    return f"the Ray run stopped: {lines[-1] if lines else type(error).__name__}"


def map_actors(
    items: list[dict], actor: type, kwargs: dict, options: RayOptions, batch_size: int
) -> Iterator[dict]:
    """Rows of `from_items(items).map_batches(actor(**kwargs), ...)` as they finish, in any
    order: `options.workers` actors, `batch_size` items per call."""
    import ray.data

    ds = ray.data.from_items(items).map_batches(
        actor,
        batch_size=batch_size,
        batch_format="numpy",
        fn_constructor_kwargs=kwargs,
        compute=ray.data.ActorPoolStrategy(size=options.workers),
        num_cpus=options.cpus_per_worker,
        num_gpus=options.gpus_per_worker,
    )
    yield from ds.iter_rows()


def _set_threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


class _Decoder:
    """A Ray Data actor: the model pair, loaded once; decodes batches of utterances, each
    in the modes it still needs, with the local runner's code. -> json records."""

    def __init__(self, load: Callable, options: EvalOptions, threads: int | None) -> None:
        _set_threads(threads)
        pair = load()
        self.evaluator = Evaluator(pair, options, ".", {})  # decodes only: writes nothing
        self.meta = json.dumps(pair_meta(pair, options.modes))
        self.warm = False

    def __call__(self, batch: dict) -> dict[str, list[str]]:
        # batch["utt"]: pickled utterances [n]; batch["modes"]: the modes each still needs [n]
        e = self.evaluator
        utts = [pickle.loads(u) for u in batch["utt"]]
        done = {
            (u.id, m) for u, todo in zip(utts, batch["modes"]) for m in e.options.modes if m not in set(todo)
        }
        if not self.warm:  # one-time costs off the first record's wall time, as in a local run
            e._warm_up(utts[0])
            self.warm = True
        records = [
            json.dumps(rec, ensure_ascii=False)
            for group, mode in e.groups(utts, done)
            for rec in e._decode(group, mode)
        ]
        return {"record": records, "meta": [self.meta] * len(records)}


class RayEvaluator(Evaluator):
    """`Evaluator` whose decodes run on Ray actors: this process loads no model, reads what
    is done, and appends the records as they come back. config.json gets the actors' model
    description (draft, device, dtype) from their first record."""

    def __init__(
        self, load: Callable, options: EvalOptions, output_dir: str | Path, meta: dict, ray: RayOptions
    ) -> None:
        super().__init__(None, options, output_dir, meta)
        self.load, self.ray, self._base = load, ray, meta

    def run(self, utts: Sequence) -> list[dict]:
        self.dir.mkdir(parents=True, exist_ok=True)
        records, done = self._resume(utts)
        todo = [(u, [m for m in self.options.modes if (u.id, m) not in done]) for u in utts]
        # pickled: an utterance of any recipe (a path and span, or a dataset row's audio bytes)
        items = [{"utt": pickle.dumps(u), "modes": modes} for u, modes in todo if modes]
        if not items:
            self.meta = read_config(self.dir) or self.meta
            return records
        return self._append(records, self._records(items))

    def _records(self, items: list[dict]) -> Iterable[dict]:
        kwargs = {"load": self.load, "options": self.options, "threads": self.ray.threads}
        first = None
        for row in map_actors(items, _Decoder, kwargs, self.ray, self.options.batch_size):
            meta = json.loads(row["meta"])
            if first is None:  # the models are known now: check or write config.json
                first = meta
                self.meta = {**self._base, **meta, **self.options.config()}
                self._check_config()
            elif _comparable(meta) != _comparable(first):
                raise ValueError(f"the Ray workers loaded different models: {first} and {meta}")
            yield json.loads(row["record"])
