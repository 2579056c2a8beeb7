"""`python -m benchmarks.beam`: its documented command parses, and it runs end to end on a
tiny random pair read from a corpus of two files, printing one row per configuration with
speculative beams' tokens equal to target-only beams'."""

from __future__ import annotations

import numpy as np
import soundfile as sf
from click.testing import CliRunner
from tiny_pairs import random_tiny_pair

from benchmarks import beam
from benchmarks.docs_check import check_command


def test_the_documented_command_parses():
    assert check_command("python -m benchmarks.beam --files 8 --repeats 2 --gammas 1,2,4") is None


def test_it_prints_each_configuration_and_the_beams_agree(tmp_path, monkeypatch):
    folder = tmp_path / "src-en"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        sf.write(folder / f"src-en-{i:05d}.wav", (0.1 * rng.standard_normal(16000)).astype("float32"), 16000)
    pair = random_tiny_pair(seed=0, draft_layers=1)
    monkeypatch.setattr("specasr.cli.common.pair_loader", lambda *a, **k: lambda: pair)
    monkeypatch.setattr(
        beam, "input_paths", lambda _inputs, _corpus, _source, n: sorted(folder.glob("*.wav"))[:n]
    )
    out = CliRunner().invoke(
        beam.main,
        ["--files", "2", "--repeats", "1", "--beams", "2", "--gammas", "2", "--max-new-tokens", "8"],
    )
    assert out.exit_code == 0, out.output
    rows = [line for line in out.output.splitlines() if line.startswith("| beam 2")]
    assert len(rows) == 3 and all(line.endswith("| yes |") for line in rows)
