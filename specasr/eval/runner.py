"""The dataset evaluation runner.

`Evaluator` decodes a dataset's utterances (recipes) in every
requested mode and appends one json line per (utterance, mode) to results.jsonl, flushed
line by line: an interrupted run leaves valid output, and a rerun skips what is done.
`merge` joins shard directories into one. report.py turns the records into
summary.json, the Table-1 style markdown table and the verifier-time plot.
"""

from __future__ import annotations

import json
import random
import sys
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import jiwer

from specasr.eval.metric import normalize
from specasr.options import MODES, DecodeOptions
from specasr.writers import write_atomic

RESULTS, CONFIG = "results.jsonl", "config.json"


@dataclass(frozen=True)
class EvalOptions:
    modes: tuple[str, ...] = MODES  # decoding modes, each run on every utterance
    decode: DecodeOptions = DecodeOptions()  # per-utterance decoding; `mode` is set per mode
    batch_size: int = 1  # utterances (of at most 30 s) per batched decode; at T > 0 each is decoded alone
    limit: int | None = None  # first N utterances (by id) after --fraction
    fraction: float | None = None  # a random fraction of the utterances, drawn with `seed`
    seed: int = 0  # seeds the --fraction draw
    shard: tuple[int, int] = (0, 1)  # (index, count): this process takes every count-th utterance

    def __post_init__(self) -> None:
        if not self.modes or any(m not in MODES for m in self.modes):
            raise ValueError(f"modes must be a non-empty subset of {MODES}, got {self.modes}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")
        i, n = self.shard
        if not 0 <= i < n:
            raise ValueError(f"shard must be I/N with 0 <= I < N, got {i}/{n}")

    def config(self) -> dict:
        """What makes two runs' records comparable (the selection and shard are not part)."""
        return {"modes": list(self.modes), "decode": asdict(self.decode), "batch_size": self.batch_size}


def paper_options(options: EvalOptions) -> EvalOptions:
    """The paper's setting: T = 1.0, adaptive γ from 5, batch 1, <= 256 tokens, sigmoid ±10^3."""
    decode = replace(
        options.decode,
        temperature=1.0,
        gamma=5,
        gamma_policy="adaptive",
        draft_stop=0.0,  # the paper's drafts always run to γ
        max_new_tokens=256,
        sigmoid_scale=(-1e3, 1e3),
    )
    return replace(options, decode=decode, batch_size=1)


def select(utts: Sequence, options: EvalOptions) -> list:
    """Utterances sorted by id -> --fraction draw -> --limit -> this shard's share."""
    utts = sorted(utts, key=lambda u: u.id)
    if options.fraction is not None:
        k = max(1, round(len(utts) * options.fraction))
        utts = sorted(random.Random(options.seed).sample(utts, k), key=lambda u: u.id)
    if options.limit is not None:
        utts = utts[: options.limit]
    i, n = options.shard
    return utts[i::n]


def pair_meta(pair, modes: Sequence[str]) -> dict:
    """What config.json records of the loaded models: the draft (None when every mode is
    target-only), the device, the dtype and the target's compute type."""
    speculative = any(m != "autoregressive" for m in modes)
    return {
        "draft": pair.draft_name if speculative else None,
        "device": str(pair.device),
        "dtype": str(pair.dtype).removeprefix("torch."),
        "compute_type": pair.compute_type,
    }


class ResultsError(ValueError):
    """An eval output directory's results.jsonl or config.json that cannot be read back."""


# what every record holds, and what a decoded one (error None) holds besides: report.py reads them
_KEYS = ("id", "mode", "error", "reference_norm")
_DECODED_KEYS = ("hypothesis_norm", "errors", "duration", "wall_s", "stats")


def _record_problem(rec) -> str | None:
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not a result record"
    missing = [k for k in _KEYS + (_DECODED_KEYS if rec.get("error") is None else ()) if k not in rec]
    if missing:
        return f"a record without {', '.join(missing)}"
    if not all(isinstance(rec[k], str) for k in ("id", "mode", "reference_norm")):
        return "a record whose id, mode or reference_norm is not a string"
    return None


def read_results(path: Path) -> list[dict]:
    """Records of a results.jsonl; a truncated last line (an interrupted write) is cut off.

    Any other line that is not a record raises `ResultsError` naming the file and the line.
    """
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
        data = data[: data.rfind(b"\n") + 1]
    records = []
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            problem = (
                f"not JSON ({e.msg} at column {e.colno})" if isinstance(e, json.JSONDecodeError) else str(e)
            )
        else:
            problem = _record_problem(rec)
        if problem is not None:
            raise ResultsError(
                f"{path}:{lineno}: {problem}. Delete that line (its utterance is decoded again), "
                "or move the file aside or use another --output-dir to start over"
            )
        records.append(rec)
    return records


def read_config(directory: str | Path) -> dict | None:
    """The config.json of an eval output directory; None when there is none."""
    path = Path(directory) / CONFIG
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        config = e
    if not isinstance(config, dict) or not isinstance(config.get("modes"), list):
        raise ResultsError(
            f"{path}: not an eval run's configuration; move the directory aside or use another --output-dir"
        )
    return config


def check_output_dir(directory: str | Path, meta: dict) -> int:
    """What can be checked of a resumed run before any model is loaded: the keys of `meta`
    (the run's configuration as far as it is known) match config.json, and results.jsonl
    reads back. Returns the number of records there; raises ValueError (ResultsError)."""
    directory = Path(directory)
    old = read_config(directory)
    if old is not None:
        new = json.loads(json.dumps(meta))
        if any(k in old and old[k] != v for k, v in _comparable(new).items()):
            raise ValueError(
                f"{directory} holds a run with another configuration ({directory / CONFIG}); "
                "use another --output-dir or delete it"
            )
    return len(read_results(directory / RESULTS))


@dataclass
class _Running:
    """Per-mode error and word counts behind the progress bar's running WER."""

    errors: dict[str, int] = field(default_factory=dict)
    words: dict[str, int] = field(default_factory=dict)

    def add(self, rec: dict) -> None:
        if rec["error"] is None and rec["reference_norm"].strip():
            m = rec["mode"]
            self.errors[m] = self.errors.get(m, 0) + rec["errors"]
            self.words[m] = self.words.get(m, 0) + len(rec["reference_norm"].split())

    def postfix(self) -> dict[str, str]:
        return {m: f"{100 * self.errors[m] / self.words[m]:.1f}%" for m in self.words if self.words[m]}


def _word_errors(ref: str, hyp: str) -> int:
    if not ref.strip():
        return 0
    out = jiwer.process_words(ref, hyp)
    return out.substitutions + out.deletions + out.insertions


def _comparable(config: dict) -> dict:
    """The part of a run's config that must match to resume or merge it: shards may run on
    different devices (cuda:0, cuda:1 …)."""
    return {k: v for k, v in config.items() if k != "device"}


class Evaluator:
    """Decodes utterances in every mode; appends to <output_dir>/results.jsonl as it goes."""

    def __init__(self, pair, options: EvalOptions, output_dir: str | Path, meta: dict) -> None:
        self.pair, self.options = pair, options
        self.dir = Path(output_dir)
        self.meta = {**meta, **options.config()}
        self.failed = 0
        # progress, for a report when the run is interrupted: decodes asked for, decodes in
        # results.jsonl (from earlier runs and this one), decodes written by this run
        self.total = self.done = self.written = 0

    def _check_config(self) -> None:
        path = self.dir / CONFIG
        old = read_config(self.dir)
        if old is not None:
            if _comparable(old) != _comparable(json.loads(json.dumps(self.meta))):
                raise ValueError(
                    f"{self.dir} holds a run with another configuration ({path}); "
                    "use another --output-dir or delete it"
                )
        else:
            write_atomic(path, json.dumps(self.meta, indent=1) + "\n")

    def run(self, utts: Sequence) -> list[dict]:
        """Runs what is not in results.jsonl yet; returns all records (old and new)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._check_config()
        records, done = self._resume(utts)
        todo = [u for u in utts if any((u.id, m) not in done for m in self.options.modes)]
        if todo:
            self._warm_up(todo[0])
        decoded = (rec for group, mode in self.groups(utts, done) for rec in self._decode(group, mode))
        return self._append(records, decoded)

    def _resume(self, utts: Sequence) -> tuple[list[dict], set[tuple[str, str]]]:
        """The records of results.jsonl that this run keeps (decoded, of these utterances and
        modes: failed ones are retried) and their (id, mode) pairs; sets the progress counts."""
        ids = {u.id for u in utts}
        path = self.dir / RESULTS
        every = read_results(path)
        mine = [r for r in every if r["id"] in ids and r["mode"] in self.options.modes]
        done = {(r["id"], r["mode"]) for r in mine if r["error"] is None}
        records = [r for r in mine if (r["id"], r["mode"]) in done]
        if len(records) < len(mine):  # failed lines are retried: drop them, so no id is written twice
            stale = {id(r) for r in mine if (r["id"], r["mode"]) not in done}
            kept = [r for r in every if id(r) not in stale]
            write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
        self.total, self.done, self.written = len(utts) * len(self.options.modes), len(done), 0
        return records, done

    def groups(self, utts: Sequence, done: set[tuple[str, str]]) -> Iterable[tuple[list, str]]:
        """(utterances, mode) still to decode: batches of `batch_size` utterances, each batch
        in every mode in turn, without the (id, mode) pairs in `done`."""
        bs = self.options.batch_size
        for k in range(0, len(utts), bs):
            batch = list(utts[k : k + bs])
            for mode in self.options.modes:
                todo = [u for u in batch if (u.id, mode) not in done]
                if todo:
                    yield todo, mode

    def _append(self, records: list[dict], decoded: Iterable[dict]) -> list[dict]:
        """Appends each record of `decoded` to results.jsonl as it comes (one flushed line
        each, so an interrupted run keeps every finished one); returns records + them."""
        from tqdm import tqdm

        running = _Running()
        for r in records:
            running.add(r)
        with (
            open(self.dir / RESULTS, "a", encoding="utf-8") as out,
            tqdm(total=self.total, initial=self.done, unit="dec", disable=not sys.stderr.isatty()) as bar,
        ):
            for rec in decoded:
                out.write(json.dumps(rec, ensure_ascii=False) + "\n")
                out.flush()
                records.append(rec)
                running.add(rec)
                self.failed += rec["error"] is not None
                self.written += 1
                self.done += rec["error"] is None
                bar.update(1)
                bar.set_postfix(running.postfix(), refresh=False)
        return records

    def _warm_up(self, utt) -> None:
        """A few untimed tokens per mode first, so that one-time costs (allocator, kernel
        compilation, caches) do not land on whichever mode happens to run first."""
        from specasr.constants import N_SAMPLES
        from specasr.decode.loop import decode
        from specasr.features import log_mel_window

        try:
            mel = log_mel_window(utt.load()[:N_SAMPLES], n_mels=self.pair.n_mels, device=self.pair.device)
            for mode in self.options.modes:
                decode(self.pair, mel, replace(self.options.decode, mode=mode, max_new_tokens=8))
        except Exception:  # the utterance's own decode records the failure
            return

    def _decode(self, utts: list, mode: str) -> Iterable[dict]:
        """Decodes a batch in one mode -> one record per utterance (errors recorded, not raised)."""
        from specasr.constants import N_SAMPLES, SAMPLE_RATE

        audio, errors = {}, {}
        for u in utts:
            try:
                audio[u.id] = u.load()
            except Exception as e:  # a bad file is recorded and the run goes on
                errors[u.id] = f"{type(e).__name__}: {e}"
        short = [u for u in utts if u.id in audio and len(audio[u.id]) <= N_SAMPLES]
        # At T = 0 a batch row decodes exactly as it would alone, so short utterances share a
        # batch. A sampled batch draws all its rows from one random stream, so when sampling
        # each utterance is decoded alone with its own seed (`_seed`): whatever the batch
        # size or shard, an utterance draws the same samples.
        if self.options.decode.temperature == 0:
            groups = [short] if short else []
        else:
            groups = [[u] for u in short]
        groups += [[u] for u in utts if u.id in audio and len(audio[u.id]) > N_SAMPLES]
        hyps: dict[str, tuple[str, dict | None, float, int]] = {}
        for group in groups:
            try:
                hyps.update(self._decode_group(group, [audio[u.id] for u in group], mode))
            except Exception as e:  # recorded per utterance; the run goes on
                errors.update({u.id: f"{type(e).__name__}: {e}" for u in group})
        for u in utts:
            ref_norm = normalize(u.text)
            rec = {"id": u.id, "mode": mode, "reference": u.text, "reference_norm": ref_norm}
            rec["duration"] = len(audio[u.id]) / SAMPLE_RATE if u.id in audio else None
            if u.id in errors:
                rec |= {"hypothesis": None, "hypothesis_norm": None, "errors": None}
                rec |= {"wall_s": None, "batch_rows": None, "stats": None, "error": errors[u.id]}
            else:
                text, stats, wall, rows = hyps[u.id]
                hyp_norm = normalize(text)
                rec |= {"hypothesis": text, "hypothesis_norm": hyp_norm}
                rec |= {"errors": _word_errors(ref_norm, hyp_norm), "wall_s": wall, "batch_rows": rows}
                rec |= {"stats": stats, "error": None}
            yield rec

    def _seed(self, utt) -> int:
        """The seed of an utterance's decode: the base seed plus a hash of its id, so that a
        sharded or differently batched sampling run draws what a single run draws."""
        return self.options.decode.seed + zlib.crc32(utt.id.encode())

    def _decode_group(self, group: list, samples: list, mode: str) -> dict:
        """-> {id: (text, stats dict or None, wall seconds, rows)}. A batch's stats and wall
        time go with its first row (the others get None and 0) so that sums stay right."""
        import torch

        from specasr.constants import N_SAMPLES
        from specasr.decode.loop import decode
        from specasr.features import log_mel_window
        from specasr.options import TranscribeOptions
        from specasr.transcription import transcribe

        if len(group) > 1 and self.options.decode.temperature > 0:
            raise ValueError("sampled utterances are decoded one at a time, each with its own seed")
        # one utterance when sampling; several only at T = 0, where nothing is drawn. timing:
        # the records' verifier time Δ%
        options = replace(self.options.decode, mode=mode, seed=self._seed(group[0]), timing=True)
        sync = self.pair.device.type == "cuda"
        t0 = time.perf_counter()
        if len(group) == 1 and len(samples[0]) > N_SAMPLES:
            topts = TranscribeOptions(
                decode=replace(options, timestamps=True), temperatures=(options.temperature,)
            )
            segments, info = transcribe(samples[0], self.pair, topts, source_rate=16000)
            texts = ["".join(s.text for s in segments).strip()]
            stats = info.stats
        else:
            mel = torch.cat(
                [log_mel_window(s, n_mels=self.pair.n_mels, device=self.pair.device) for s in samples]
            )
            results = decode(self.pair, mel, options)  # mel: [B, n_mels, 3000]
            texts, stats = [r.text.strip() for r in results], results[0].stats
        if sync:
            torch.cuda.synchronize(self.pair.device)
        wall = time.perf_counter() - t0
        out = {}
        for j, (u, text) in enumerate(zip(group, texts)):
            first = j == 0
            out[u.id] = (text, stats.to_dict() if first else None, wall if first else 0.0, len(group))
        return out


def merge(dirs: Sequence[str | Path]) -> tuple[dict, list[dict]]:
    """Shard directories -> (their common config, records by (id, mode), de-duplicated)."""
    configs, records = [], {}
    for d in dirs:
        path = Path(d) / CONFIG
        if not path.is_file():
            raise ValueError(f"{d} is not an eval output directory (no {CONFIG})")
        configs.append(read_config(d))
        for r in read_results(Path(d) / RESULTS):
            key = (r["id"], r["mode"])
            if key not in records or records[key]["error"] is not None:
                records[key] = r
    if any(_comparable(c) != _comparable(configs[0]) for c in configs[1:]):
        raise ValueError(
            "the directories hold runs with different configurations; merge only shards of one run"
        )
    order = {m: i for i, m in enumerate(configs[0]["modes"])}
    return configs[0], sorted(records.values(), key=lambda r: (r["id"], order.get(r["mode"], 0)))
