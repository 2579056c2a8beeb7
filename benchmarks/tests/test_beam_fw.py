"""`python -m benchmarks.beam_fw`: its documented command parses and its faster-whisper script
is Python (faster-whisper itself runs only where it is installed)."""

from __future__ import annotations

import ast

from benchmarks.beam_fw import FW_BEAM_SCRIPT
from benchmarks.docs_check import check_command


def test_the_documented_command_parses_and_the_script_compiles():
    corpus = "--corpus CORPUS/heldout --source asterisk:en --per-source 16"
    assert check_command(f"python -m benchmarks.beam_fw {corpus} --repeats 3") is None
    ast.parse(FW_BEAM_SCRIPT)


def test_runs_are_interleaved_and_the_table_gives_ratios_and_wer():
    from benchmarks.beam_fw import interleaved, table

    order = []
    runs = {name: (lambda n=name: order.append(n) or f" the cat sat {n} ") for name in ("a", "b")}
    walls, texts = interleaved(runs, repeats=2)
    assert order == ["a", "b"] * 3 and texts == {"a": "the cat sat a", "b": "the cat sat b"}
    out = table("In-process", {"a": [2.0, 4.0], "b": [1.0, 1.0]}, texts, "the cat sat", "a")
    assert "| a | 3.00 | 1.00× | 33.3% |" in out and "| b | 1.00 | 3.00× | 33.3% |" in out
