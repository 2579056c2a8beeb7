"""What a busy machine costs a program, by what its second thread gains it (issue 53).

    python -m benchmarks.busy_bound [--repeats 3 --products 240]

Issue 53 asks that specasr slow beside busy processes no more than faster-whisper does. This
measures, on synthetic work, how that factor depends on how a program uses its threads, so
the two tools' factors can be read against what their second thread gains them quiet.

The work is `--products` encoder-shaped fp32 products ([1500, 512] @ [512, 512]) in rounds
of `ROUND` products: a share `s` of each round on one thread (a program's serial part), the
rest on two threads, in one of three ways:

- `balanced`: two worker threads of one torch thread each take the products from a queue,
  so a worker that shares its core with a busy process does fewer (a dynamic split);
- `torch split`: each product is one torch call on two threads, split evenly (OpenMP's
  static split, as torch's ops run, and so the most of specasr's work), each call waiting
  for its slower half;
- `balanced, 3 workers`: three workers on two CPUs, a larger share of the machine than
  two threads' (measured for what it shows, not what specasr does).

The row `one thread` runs every product on one thread; the column "gain" is its quiet time
over the row's, what two threads gain that work. Each row runs as a fresh process beside 0, 1
and 2 busy processes (`whole_process.BUSY`), interleaved; the process sets OpenMP's waiting
as the CLI does (`specasr.backends.process.passive_when_busy`: passive when the machine is
busy at its start), and reports the seconds of its work alone. The table gives the medians
and each row's slowdown against its own quiet median.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import click

from benchmarks.serve_load import commit, machine
from benchmarks.whole_process import BUSY

ROUND = 20  # products per round: serial ones first, then the parallel ones (even, for two threads)
SHAPE = (1500, 512, 512)  # an encoder product of whisper base: frames, in, out


@dataclass(frozen=True)
class Way:
    name: str
    kind: str  # "one", "balanced", "split"
    serial: float  # share of each round on one thread
    workers: int = 2


def ways() -> list[Way]:
    out = [Way("one thread", "one", 1.0, 1)]
    for s in (0.0, 0.3, 0.6):
        out += [Way(f"balanced, s = {s}", "balanced", s), Way(f"torch split, s = {s}", "split", s)]
    out.append(Way("balanced, 3 workers, s = 0.0", "balanced", 0.0, 3))
    return out


def rounds(products: int, serial: float) -> list[tuple[int, int]]:
    """(serial, parallel) products per round, `products` in all."""
    k = round(ROUND * serial)
    n = max(1, products // ROUND)
    return [(k, ROUND - k)] * n


def work_seconds(kind: str, serial: float, workers: int, products: int) -> float:
    """In a fresh process: the seconds of the work alone (torch imported and warm first)."""
    from specasr.backends import process

    process.passive_when_busy()  # before torch: OpenMP's waiting as the CLI sets it
    import queue
    import threading

    import torch

    m, k, n = SHAPE
    a, b = torch.randn(m, k), torch.randn(k, n)
    torch.set_num_threads(1 if kind in ("one", "balanced") else 2)
    jobs: queue.Queue = queue.Queue()
    done = threading.Semaphore(0)

    def worker() -> None:
        torch.set_num_threads(1)
        while jobs.get() is not None:
            torch.mm(a, b)
            done.release()

    pool = workers if kind == "balanced" else 0
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(pool)]
    for t in threads:
        t.start()

    def one_round(s: int, p: int) -> None:
        if kind == "split" and s:  # the serial part on this thread alone
            torch.set_num_threads(1)
        for _ in range(s):
            torch.mm(a, b)
        if kind == "split" and s:
            torch.set_num_threads(2)
        if kind == "balanced":
            for _ in range(p):
                jobs.put(1)
            for _ in range(p):
                done.acquire()
        else:
            for _ in range(p):
                torch.mm(a, b)

    plan = rounds(products, serial)
    one_round(*plan[0])  # warm: the threads' first products
    start = time.perf_counter()
    for s, p in plan:
        one_round(s, p)
    seconds = time.perf_counter() - start
    for _ in threads:
        jobs.put(None)
    for t in threads:
        t.join()
    return seconds


def run_way(way: Way, products: int, busy: int) -> float:
    """A fresh process doing `way`'s work beside `busy` busy processes -> its work's seconds."""
    spinning = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
    try:
        time.sleep(0.3 if busy else 0.0)  # past their interpreters' start: each is spinning
        args = ["--child", way.kind, "--serial", str(way.serial), "--workers", str(way.workers)]
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.busy_bound", *args, "--products", str(products)],
            capture_output=True,
            text=True,
            check=True,
        )
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        for p in spinning:
            p.kill()
            p.wait()


def table(seconds: dict[str, dict[int, list[float]]]) -> str:
    """Per way: the gain of its two threads quiet, the median seconds per level, the slowdowns."""
    levels = sorted(next(iter(seconds.values())))
    one = statistics.median(seconds["one thread"][0])
    head = " | ".join(f"{n} busy: s | slowdown" if n else "quiet: s" for n in levels)
    lines = [f"| work | gain | {head} |", "|---|---" + "|---" * sum(2 if n else 1 for n in levels) + "|"]
    for name, by_level in seconds.items():
        quiet = statistics.median(by_level[0])
        cells = [
            f"{statistics.median(by_level[n]):.2f} | {statistics.median(by_level[n]) / quiet:.2f}×"
            if n
            else f"{quiet:.2f}"
            for n in levels
        ]
        lines.append(f"| {name} | {one / quiet:.2f}× | {' | '.join(cells)} |")
    return "\n".join(lines)


@click.command()
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--products", type=click.IntRange(min=ROUND), default=240, show_default=True)
@click.option("--busy", "levels", default="0,1,2", show_default=True, help="Busy levels; 0 first.")
@click.option("--child", type=click.Choice(["one", "balanced", "split"]), hidden=True)
@click.option("--serial", type=float, default=0.0, hidden=True)
@click.option("--workers", type=int, default=2, hidden=True)
def main(repeats: int, products: int, levels: str, child: str | None, serial: float, workers: int) -> None:
    if child is not None:
        click.echo(f"{work_seconds(child, serial, workers, products):.6f}")
        return
    busy = sorted({int(n) for n in levels.split(",") if n.strip()})
    if not busy or busy[0] != 0:
        raise click.BadParameter("the levels must include 0, the quiet reference", param_hint="--busy")
    chosen = ways()
    seconds = {w.name: {n: [] for n in busy} for w in chosen}
    for w in chosen:  # a warm-up round: the page cache, torch's first import
        run_way(w, ROUND, 0)
    for _ in range(repeats):
        for w in chosen:
            for n in busy:
                seconds[w.name][n].append(run_way(w, products, n))
    command = f"python -m benchmarks.busy_bound --repeats {repeats} --products {products}"
    click.echo(f"{command}\n{machine()}, commit {commit()}\n")
    click.echo(table(seconds))
    record = {"command": command, "machine": machine(), "commit": commit(), "seconds": seconds}
    click.echo("\n" + json.dumps(record))


if __name__ == "__main__":
    main()
