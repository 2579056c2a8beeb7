"""`python -m benchmarks.shared_batch`: its documented command parses, and its two ways of
decoding give every row the same tokens (tiny random pair)."""

from __future__ import annotations

from dataclasses import replace

import torch
from tiny_pairs import random_tiny_pair

from benchmarks.docs_check import check_command
from benchmarks.shared_batch import decode_rows
from specasr.options import DecodeOptions


def test_the_documented_command_parses():
    assert check_command("python -m benchmarks.shared_batch --rows 16 --repeats 3") is None


def test_one_batch_and_one_by_one_give_each_row_its_tokens():
    pair = replace(random_tiny_pair(seed=0, draft_layers=1), draft=None)
    g = torch.Generator().manual_seed(3)
    states = [10 * torch.randn(1, 1500, 64, generator=g) for _ in range(3)]  # [1, 1500, d] each
    options = DecodeOptions(mode="autoregressive", language="en", max_new_tokens=8, timing=True)
    alone, batch = (decode_rows(pair, states, options, batched) for batched in (False, True))
    assert alone[3] == batch[3] and len(batch[3]) == 3
    assert all(len(t) > 0 for t in batch[3])
    assert batch[1] > 0 and alone[1] > 0  # decoder seconds, timed
