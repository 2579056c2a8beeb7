"""`specasr serve` under load, beside the same files in one warm process and faster-whisper's.

    python -m benchmarks.serve_load [--model base --draft default --compute-type float32]
        [--clients 1,4,16 --requests 48] [--corpus /tmp/corpus/heldout --source asterisk:en
        --per-source 16 | --files 'GLOB' ...] [--whole-process --repeats 5]

1. Starts `specasr serve --max-concurrent 16` in a subprocess; per client level c, after an
   untimed warm-up round of c requests, runs c threads that each post requests back to back
   (OpenAI's `POST /v1/audio/transcriptions`, `verbose_json`) until `--requests` are done,
   cycling through the files. Per level: audio seconds per wall second (the requests' audio over the
   level's wall time), throughput against the lowest level, p50 and p95 latency (request sent
   to response read). The server gets SIGTERM at the end and must exit 0.
2. The same files one by one in this process with the library (`load_pair` + `transcribe`
   with `front_end_options()`, the CLI's defaults, which the server uses too), timed after one
   warm-up file. At T = 0 every response's text must equal the library's text for its file
   (both `"".join(segment texts).strip()`), at every level: concurrent requests decode as
   rows of one batch, and a row's tokens are those it gets alone (longform/engine.py).
3. faster-whisper on the same CTranslate2 weights (`whole_process.ct2_dir`), its
   `BatchedInferencePipeline` and its sequential `WhisperModel.transcribe`, int8, the files
   looped in one warm worker process (`fw_process`: never in a process that imported torch).
   Each call includes handing the samples over (a .npy file, milliseconds).
4. `--whole-process`: fresh processes, alternately, on the bundled example and the first
   input: `specasr transcribe FILE` (models loaded every run) against `specasr transcribe FILE
   --server URL` (the running server; the client imports no torch); medians, peak RSS, the
   ratio, and whether both printed the same text.

Prints the machine, the commit and the command line (a docs/benchmarks.md stamp), markdown
tables, and last one JSON line with every number. Run it on a quiet machine: client threads,
server and worker share the cores. The file inputs are the held-out split of `specasr distill
corpus CORPUS --windows 120 --source asterisk:en`, speech no draft trained on.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import click
import soundfile as sf

from specasr.constants import COMPUTE_TYPES

MAX_CONCURRENT = 16  # the server's --max-concurrent: the highest default client level
REQUEST_TIMEOUT = 1800.0  # seconds: a request queued behind 15 others on a slow machine
# the server's own proxy-free address: an http_proxy in the environment must not see it
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Clip:
    path: str
    seconds: float
    data: bytes  # the file's bytes, read once: requests time the server, not the disk


@dataclass(frozen=True)
class Done:
    clip: int  # index into the clips
    latency: float  # seconds, request sent -> response read
    text: str


@dataclass
class Level:
    clients: int
    wall: float = 0.0  # seconds, first request sent -> last response read
    done: list[Done] = field(default_factory=list)


def parse_clients(value: str) -> list[int]:
    """'1,4,16' -> [1, 4, 16]: positive, ascending, each once."""
    try:
        levels = sorted({int(v) for v in value.split(",") if v.strip()})
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: expected comma-separated counts", param_hint="'--clients'"
        ) from None
    if not levels or levels[0] < 1:
        raise click.BadParameter(f"{value!r}: counts must be at least 1", param_hint="'--clients'")
    return levels


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("no values")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarise(level: Level, clips: list[Clip], library: list[str]) -> dict:
    """One level's row: audio seconds per wall second, latency percentiles, how many
    responses gave the library's text for their file (`same`), each file's text (its first
    response's) and every response that differed (`differ`)."""
    latencies = [d.latency for d in level.done]
    audio = sum(clips[d.clip].seconds for d in level.done)
    texts: dict[str, str] = {}
    for d in level.done:
        texts.setdefault(clips[d.clip].path, d.text)
    differ = [
        {"path": clips[d.clip].path, "server": d.text, "library": library[d.clip]}
        for d in level.done
        if d.text != library[d.clip]
    ]
    return {
        "clients": level.clients,
        "requests": len(level.done),
        "audio_s": audio,
        "wall_s": level.wall,
        "rate": audio / level.wall,
        "p50_s": percentile(latencies, 50),
        "p95_s": percentile(latencies, 95),
        "same": len(level.done) - len(differ),
        "latencies_s": latencies,
        "texts": texts,
        "differ": differ,
    }


def load_table(rows: list[dict]) -> str:
    """The server's levels; throughput against the first (lowest) level."""
    ref = rows[0]
    lines = [
        f"| clients | requests | audio s | wall s | audio s / s | vs {ref['clients']} client(s) "
        "| p50 latency s | p95 latency s | = library |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['clients']} | {r['requests']} | {r['audio_s']:.1f} | {r['wall_s']:.2f} | {r['rate']:.2f} "
            f"| {r['rate'] / ref['rate']:.2f}× | {r['p50_s']:.2f} | {r['p95_s']:.2f} "
            f"| {r['same']}/{r['requests']} |"
        )
    return "\n".join(lines)


def process_table(rows: list[dict]) -> str:
    """Files one by one in one warm process; speed against the first row."""
    ref = rows[0]
    lines = [
        f"| system | files | audio s | wall s | audio s / s | vs {ref['name']} |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['files']} | {r['audio_s']:.1f} | {r['wall_s']:.2f} | {r['rate']:.2f} "
            f"| {r['rate'] / ref['rate']:.2f}× |"
        )
    return "\n".join(lines)


def whole_table(rows: list[dict]) -> str:
    """Fresh processes per clip: local CLI against the --server client."""
    lines = [
        "| clip | command | wall (median, s) | lowest – highest | peak RSS (median, MB) | local / this |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        local = statistics.median(r["walls"][0])
        for name, walls, rss in zip(r["names"], r["walls"], r["rss"]):
            wall = statistics.median(walls)
            lines.append(
                f"| {r['clip']} | {name} | {wall:.2f} | {min(walls):.2f} – {max(walls):.2f} "
                f"| {statistics.median(rss):.0f} | {local / wall:.2f}× |"
            )
    return "\n".join(lines)


def multipart(fields: dict[str, str], filename: str, data: bytes) -> tuple[bytes, str]:
    """A multipart/form-data body of `fields` and a `file` part, and its Content-Type."""
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    )
    parts.append(head.encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def transcribe_request(url: str, clip: Clip, language: str | None) -> dict:
    """One `POST /v1/audio/transcriptions` (verbose_json); the response's JSON."""
    fields = {"model": "whisper-1", "response_format": "verbose_json"}
    if language is not None:
        fields["language"] = language
    body, content_type = multipart(fields, Path(clip.path).name, clip.data)
    request = urllib.request.Request(
        f"{url}/v1/audio/transcriptions", data=body, headers={"Content-Type": content_type}
    )
    try:
        with _OPENER.open(request, timeout=REQUEST_TIMEOUT) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{clip.path}: HTTP {e.code}: {e.read().decode(errors='replace')[:500]}") from e


def run_level(url: str, clips: list[Clip], clients: int, requests: int, language: str | None) -> Level:
    """`clients` threads posting back to back until `requests` are done, request i for clip
    i mod len(clips). The first error stops every thread and is raised."""
    level, lock, errors = Level(clients), threading.Lock(), []
    order = iter(range(requests))
    start = threading.Barrier(clients + 1)

    def client() -> None:
        start.wait()
        while not errors:
            with lock:
                i = next(order, None)
            if i is None:
                return
            clip = i % len(clips)
            t0 = time.perf_counter()
            try:
                text = transcribe_request(url, clips[clip], language)["text"]
            except Exception as e:  # raised by the caller, once every thread has stopped
                errors.append(e)
                return
            with lock:
                level.done.append(Done(clip, time.perf_counter() - t0, text))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    level.wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return level


class Server:
    """`specasr serve` in a subprocess, its output in a temporary log file."""

    def __init__(self, args: list[str], port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.command = [sys.executable, "-m", "specasr", "serve", *args, "--port", str(port)]
        self._log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, text=True)

    def log_tail(self, chars: int = 2000) -> str:
        self._log.seek(0)
        return self._log.read()[-chars:]

    def wait_ready(self, timeout: float) -> None:
        """Polls GET /health until it answers 200; an exited server or the timeout raise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                with _OPENER.open(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the server did not answer /health within {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then its exit status (killed, -9, if it outlives `timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def input_paths(files: tuple[str, ...], corpus: str, source: str, per_source: int) -> list[str]:
    """--files globs in order (each file once), else the first `per_source` windows of
    `source` in corpus/corpus.jsonl."""
    if files:
        paths = list(dict.fromkeys(p for pattern in files for p in sorted(glob.glob(pattern))))
        if not paths:
            raise click.BadParameter(f"no file matches {list(files)}", param_hint="'--files'")
        return paths
    from specasr.recipes.speech_corpus import read_manifest

    if not (Path(corpus) / "corpus.jsonl").is_file():
        raise click.BadParameter(
            f"{corpus}/corpus.jsonl not found (specasr distill corpus)", param_hint="'--corpus'"
        )
    records = [r for r in read_manifest(corpus) if r.get("source") == source][:per_source]
    if not records:
        raise click.BadParameter(
            f"no windows of {source!r} in {corpus}/corpus.jsonl", param_hint="'--source'"
        )
    return [str(Path(corpus) / r["path"]) for r in records]


def read_clips(paths: list[str]) -> list[Clip]:
    return [Clip(p, sf.info(p).duration, Path(p).read_bytes()) for p in paths]


def timed_loop(clips: list[Clip], run) -> tuple[float, list[str]]:
    """`run(clip) -> text` over the clips after one warm-up call: (wall s, texts)."""
    run(clips[0])
    t0 = time.perf_counter()
    texts = [run(c) for c in clips]
    return time.perf_counter() - t0, texts


def library_run(
    clips: list[Clip], model: str, draft: str, compute_type: str, language: str | None
) -> tuple[float, list[str]]:
    """The files one by one through `specasr.transcribe`, the models loaded once in this
    process as `specasr serve` loads them (`cli.common.load_models`: `load_pair` by the CLI's
    option values)."""
    import specasr
    from specasr.cli.common import pair_loader
    from specasr.options import DETECT_LANGUAGE, front_end_options

    mode = "autoregressive" if draft == "none" else "exact"  # as cli/serve.py decides
    pair = pair_loader(model, draft, mode, None, None, compute_type)()
    options = front_end_options(mode=mode, language=language or DETECT_LANGUAGE)

    def run(clip: Clip) -> str:
        segments, _ = specasr.transcribe(clip.path, pair, options)
        return "".join(s.text for s in segments).strip()

    return timed_loop(clips, run)


def faster_whisper_rows(clips: list[Clip], model: str, threads: int, language: str | None) -> list[dict]:
    """faster-whisper int8 on `model`'s packaged CTranslate2 files (a KeyError or
    FileNotFoundError where there are none): batched, then sequential."""
    import shutil

    from benchmarks.fw_process import FasterWhisperProcess
    from benchmarks.whole_process import BATCH, ct2_dir
    from specasr.audio import load_audio
    from specasr.models.loading import offline_files

    samples = {c.path: load_audio(c.path) for c in clips}
    rows = []
    with tempfile.TemporaryDirectory(prefix="specasr-serve-load-") as work:
        fw_dir = ct2_dir(Path(work), model)
        for vocabulary in offline_files(model).config.parent.glob("vocabulary.*"):
            if not (fw_dir / vocabulary.name).is_file():  # ct2_dir copies the json form only
                shutil.copy(vocabulary, fw_dir / vocabulary.name)
        for name, batch in ((f"faster-whisper batched B={BATCH}, int8", BATCH), ("faster-whisper int8", 0)):
            worker = FasterWhisperProcess(fw_dir, threads, "int8", batch, language)
            try:
                wall, _ = timed_loop(clips, lambda c, run=worker: run(samples[c.path]))
            finally:
                worker.close()
            rows.append(process_row(name, clips, wall))
    return rows


def process_row(name: str, clips: list[Clip], wall: float) -> dict:
    audio = sum(c.seconds for c in clips)
    return {"name": name, "files": len(clips), "audio_s": audio, "wall_s": wall, "rate": audio / wall}


def whole_process_rows(clips: list[str], cli_args: list[str], url: str, repeats: int) -> list[dict]:
    """Per clip, `specasr transcribe CLIP [model flags]` and `... --server URL` as fresh
    processes, alternately, after one warm-up round."""
    from benchmarks.whole_process import compile_bytecode, run_measured

    compile_bytecode()
    out = []
    for clip in clips:
        base = [sys.executable, "-m", "specasr", "transcribe", clip]
        commands = [[*base, *cli_args], [*base, "--server", url]]
        names = [
            " ".join(["specasr transcribe", *map(shlex.quote, cli_args)]),
            "specasr transcribe --server URL",
        ]
        for c in commands:
            run_measured(c)
        walls, rss, texts = [[], []], [[], []], [set(), set()]
        for _ in range(repeats):
            for k, c in enumerate(commands):
                wall, peak, text = run_measured(c)
                walls[k].append(wall)
                rss[k].append(peak)
                texts[k].add(text.strip())
        same = len(texts[0] | texts[1]) == 1
        out.append({"clip": Path(clip).name, "names": names, "walls": walls, "rss": rss, "same_text": same})
    return out


def machine() -> str:
    from importlib.metadata import version

    name = platform.processor() or "unknown CPU"
    try:
        name = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} cores, torch {version('torch')}"


def commit() -> str:
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip() or "unknown"


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--compute-type", type=click.Choice(COMPUTE_TYPES), default="float32", show_default=True)
@click.option("--clients", default=f"1,4,{MAX_CONCURRENT}", show_default=True, help="Client levels.")
@click.option("--requests", type=click.IntRange(min=1), default=48, show_default=True, help="Per level.")
@click.option("--port", type=int, default=0, help="The server's port (default: a free one).")
@click.option("--files", multiple=True, help="Globs of audio files, instead of the corpus; repeatable.")
@click.option("--corpus", default="/tmp/corpus/heldout", show_default=True, help="A corpus split.")
@click.option("--source", default="asterisk:en", show_default=True, help="--corpus: the source.")
@click.option("--per-source", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--language", default=None, help="Sent to every system (default: each detects it).")
@click.option("--faster-whisper/--no-faster-whisper", "with_fw", default=True, show_default=True)
@click.option("--threads", type=int, default=os.cpu_count() or 1, show_default=True, help="faster-whisper's.")
@click.option(
    "--whole-process", is_flag=True, help="Also fresh `specasr transcribe` processes, local and --server."
)
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True, help="--whole-process.")
@click.option("--start-timeout", type=float, default=600.0, show_default=True, help="Seconds for /health.")
def main(
    model,
    draft,
    compute_type,
    clients,
    requests,
    port,
    files,
    corpus,
    source,
    per_source,
    language,
    with_fw,
    threads,
    whole_process,
    repeats,
    start_timeout,
) -> None:
    from importlib.resources import files as resources
    from importlib.util import find_spec

    levels_wanted = parse_clients(clients)
    clips = read_clips(input_paths(files, corpus, source, per_source))
    if requests < len(clips):
        click.echo(
            f"note: {requests} requests per level reach only {requests} of {len(clips)} files", err=True
        )
    command = shlex.join(["python", "-m", "benchmarks.serve_load", *sys.argv[1:]])
    record = {"command": command, "machine": machine(), "commit": commit(), "files": [c.path for c in clips]}
    click.echo(
        f'<!-- stamp: command="{command}" machine="{record["machine"]}" commit="{record["commit"]}" -->'
    )
    click.echo(f"*Command:* `{command}` · *machine:* {record['machine']} · *commit:* {record['commit']}\n")
    click.echo(
        f"{len(clips)} files, {sum(c.seconds for c in clips):.1f} s of audio; {requests} requests per level\n"
    )

    model_args = ["--model", model, "--draft", draft, "--compute-type", compute_type]
    server = Server([*model_args, "--max-concurrent", str(MAX_CONCURRENT)], port or free_port())
    try:
        server.wait_ready(start_timeout)
        levels = []
        for c in levels_wanted:
            # a warm-up round, one request per client: a batch's first passes at a new row
            # count (TorchScript's profiling runs) stay out of the timed level
            run_level(server.url, clips, c, c, language)
            levels.append(run_level(server.url, clips, c, requests, language))
        whole = None
        if whole_process:
            defaults = {"--model": "base", "--draft": "default", "--compute-type": "float32"}
            pairs = zip(model_args[::2], model_args[1::2])
            cli_args = [w for k, v in pairs if defaults[k] != v for w in (k, v)]
            cli_args += ["--language", language] if language else []
            example = str(resources("specasr") / "assets" / "example.wav")
            whole = whole_process_rows([example, clips[0].path], cli_args, server.url, repeats)
    finally:
        status = server.stop()

    wall, texts = library_run(clips, model, draft, compute_type, language)
    rows = [summarise(level, clips, texts) for level in levels]
    same, total = sum(r["same"] for r in rows), sum(r["requests"] for r in rows)
    processes = [process_row(f"specasr library ({compute_type})", clips, wall)]
    if with_fw and find_spec("faster_whisper") is None:
        click.echo("faster-whisper is not installed (pip install 'specasr[bench]'): its rows are skipped\n")
    elif with_fw:
        try:
            processes += faster_whisper_rows(clips, model, threads, language)
        except (KeyError, FileNotFoundError) as e:
            click.echo(f"faster-whisper skipped: no CTranslate2 files for {model!r} ({e})\n")

    click.echo(f"### specasr serve --max-concurrent {MAX_CONCURRENT}, {requests} requests per level\n")
    click.echo(load_table(rows) + "\n")
    click.echo(f"identical to the library at T = 0: {'yes' if same == total else 'no'} ({same} of {total})")
    for r in rows:
        for d in r["differ"]:
            click.echo(
                f"- {r['clients']} clients, {d['path']}: server {d['server']!r}, library {d['library']!r}"
            )
    click.echo(f"server exit status after SIGTERM: {status}\n")
    click.echo("### files one by one, one warm process, after one warm-up file\n")
    click.echo(process_table(processes) + "\n")
    if whole is not None:
        click.echo(f"### whole processes, {repeats} runs each, alternating\n")
        click.echo(whole_table(whole) + "\n")
        for w in whole:
            click.echo(f"- {w['clip']}: same text local and --server: {'yes' if w['same_text'] else 'no'}")
        click.echo("")
    record.update(
        levels=rows, identical=[same, total], server_exit=status, processes=processes, whole_process=whole
    )
    record["texts"] = {c.path: t for c, t in zip(clips, texts)}
    click.echo(json.dumps(record, ensure_ascii=False))
    if status != 0 or same != total or (whole and not all(w["same_text"] for w in whole)):
        sys.exit(1)


if __name__ == "__main__":
    main()
