"""`python -m benchmarks.openmp_teams`: its documented command parses, a round transcribes
every file, and the table compares each row's decoder time with the main thread's, trick on."""

from __future__ import annotations

import numpy as np
import soundfile as sf
from tiny_pairs import random_tiny_pair

from benchmarks.docs_check import check_command
from benchmarks.openmp_teams import table, transcribe_round
from specasr.options import front_end_options


def test_the_documented_command_parses():
    assert check_command("python -m benchmarks.openmp_teams --repeats 3") is None


def test_a_round_transcribes_every_file_and_times_it(tmp_path):
    paths = []
    for i in range(2):
        paths.append(str(tmp_path / f"{i}.wav"))
        noise = np.random.default_rng(i).standard_normal(16000 * (i + 1)).astype(np.float32) * 0.1
        sf.write(paths[-1], noise, 16000)
    pair = random_tiny_pair(seed=0)
    r = transcribe_round(pair, paths, front_end_options(language="en"))
    assert len(r["texts"]) == 2 and r["wall"] > 0 and r["encoder"] > 0 and r["wall"] >= r["encoder"]


def test_the_table_puts_each_row_against_the_main_thread_with_the_trick_on():
    row = lambda decoder: {"wall": 2 * decoder, "encoder": 1.0, "decoder": decoder}  # noqa: E731
    results = {"on": {"main": row(2.0), "worker": row(2.0)}, "off": {"main": row(3.0), "worker": row(3.3)}}
    lines = table(results).splitlines()
    assert len(lines) == 6
    assert [line.rsplit("|", 2)[1].strip() for line in lines[2:]] == ["1.00×", "1.00×", "1.50×", "1.65×"]
