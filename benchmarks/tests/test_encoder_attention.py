"""`python -m benchmarks.encoder_attention`: its documented command parses, the bf16 forms it
compares are the two it names (torch's fp32 attention, the library's), and the environment it
borrows to build the first is left as it was."""

from __future__ import annotations

import os

import pytest
import torch

from benchmarks.docs_check import check_command
from benchmarks.encoder_attention import bf16_forms, distance
from specasr.backends.cpu.bf16 import Bf16Attention
from specasr.models.whisper import SelfAttention, WhisperDims, WhisperEncoder


def test_the_documented_command_parses():
    assert check_command("python -m benchmarks.encoder_attention --repeats 7") is None


def test_distance_is_relative_to_the_reference():
    want = torch.tensor([3.0, 4.0])
    assert distance(want, want) == 0.0
    assert distance(torch.tensor([3.0, 4.5]), want) == pytest.approx(0.1)


@pytest.mark.parametrize("before", [None, "1"])
def test_the_forms_attend_as_named_and_leave_the_environment_as_it_was(monkeypatch, before):
    if Bf16Attention.of(2, 128) is None:
        pytest.skip("the compiled library has no AVX512_BF16 attention on this machine")
    if before is None:
        monkeypatch.delenv("SPECASR_FUSED_DRAFT", raising=False)
    else:
        monkeypatch.setenv("SPECASR_FUSED_DRAFT", before)
    encoder = WhisperEncoder(WhisperDims(100, 80, 128, 1, 1, 2, 2, 256, 256))
    plain, fast = bf16_forms(encoder)
    assert type(plain.layers[0].attend) is SelfAttention and isinstance(fast.layers[0].attend, Bf16Attention)
    assert type(encoder.layers[0].attend) is SelfAttention  # the given encoder is not converted
    assert os.environ.get("SPECASR_FUSED_DRAFT") == before
