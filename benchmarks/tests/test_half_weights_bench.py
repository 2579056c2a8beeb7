"""benchmarks/half_weights.py: both forms of the decoder weights load side by side, and the
A/B table says the forms gave the same tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from benchmarks import half_weights
from specasr.backends.cpu.linear import HalfPackedHead, PackedHead, half_available

pytestmark = pytest.mark.skipif(not half_available(), reason="this torch build has no fbgemm fp16 GEMM")


def test_load_both_gives_each_form():
    pairs = half_weights.load_both("base", "default")
    assert type(pairs["fp32-packed"].target.proj_out) is PackedHead
    assert type(pairs["fp16-packed"].target.proj_out) is HalfPackedHead
    assert pairs["fp16-packed"].target.model.decoder.layers[0].fc1.few is not None
    assert pairs["fp32-packed"].target.model.decoder.layers[0].fc1.few is None


def test_the_ab_table_reports_every_configuration_with_the_same_tokens(one_clip_data):
    data = one_clip_data
    args = ["--repeats", "1", "--data", str(data), "--load-rounds", "1"]
    result = CliRunner().invoke(half_weights.main, args)
    assert result.exit_code == 0, result.output
    assert "same tokens in every run of a strategy: yes" in result.output
    rows = [
        r for r in result.output.splitlines() if r.startswith("| sequential") or r.startswith("| chunked")
    ]
    assert len(rows) == 4 and all(r.count("×") == 2 for r in rows)
    assert "import + load_pair, fresh processes, median of 1: fp32-packed" in result.output


def test_half_weights_added_after_load_reach_the_decoding_loop():
    """`use_half_weights` on a loaded pair: the lean view the loop runs is rebuilt with the
    fp16 forms (its cache follows the head), and greedy tokens stay the same."""
    from specasr.models.loading import load_pair
    from specasr.models.whisper import use_half_weights
    from specasr.options import DecodeOptions
    from specasr.runtime.runner import lean_decoder
    from specasr.transcription import transcribe_clip

    pair = load_pair("base", "default")
    assert lean_decoder(pair.target).steps[0].few_rows == 0
    clip = str(sorted(Path("tests/data").glob("*.wav"))[0])
    opts = DecodeOptions(mode="exact")
    before = transcribe_clip(clip, pair, opts).tokens
    assert use_half_weights(pair.target)
    assert lean_decoder(pair.target).steps[0].few_rows > 0
    assert transcribe_clip(clip, pair, opts).tokens == before
