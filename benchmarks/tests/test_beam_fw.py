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
