"""`python -m benchmarks.coupled`: its documented command parses, and its decode of a few
windows gives the autoregressive tokens under the coupled rule (tiny random pair)."""

from __future__ import annotations

from dataclasses import replace

import torch
from tiny_pairs import random_tiny_pair

from benchmarks.coupled import decode_all
from benchmarks.docs_check import check_command
from specasr.options import DecodeOptions


def test_the_documented_command_parses():
    assert check_command("python -m benchmarks.coupled --files 8 --repeats 2") is None


def test_each_rule_decodes_and_the_coupled_one_keeps_the_autoregressive_tokens():
    pair = random_tiny_pair(seed=0, draft_layers=1)
    g = torch.Generator().manual_seed(5)
    mels = [torch.randn(1, 80, 3000, generator=g) for _ in range(2)]  # [1, 80, 3000] each
    base = DecodeOptions(temperature=0.8, seed=2, max_new_tokens=12, gamma=3, draft_stop=0.0)
    ar = decode_all(pair, mels, replace(base, mode="autoregressive"))
    coupled = decode_all(pair, mels, base)
    rejection = decode_all(pair, mels, replace(base, sampling="rejection"))
    assert coupled[1] == ar[1] and all(coupled[1])
    assert coupled[2].proposed > 0 and rejection[2].proposed > 0 and coupled[0] > 0
