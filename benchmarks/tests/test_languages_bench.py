"""benchmarks/languages.py: per-source rows from a held-out corpus split, α̂ and the paired
decoder-phase timing, on a random tiny pair."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from tiny_pairs import random_tiny_pair

from benchmarks.languages import corpus_groups, measure, token_alpha


def test_corpus_groups_are_by_source_in_their_language_and_capped(tmp_path):
    lines = [
        {"id": f"a{i}", "path": f"asterisk-fr/a{i}.wav", "source": "asterisk:fr", "language": "fr"}
        for i in range(5)
    ]
    lines += [{"id": "c0", "path": "fillets-cs/c0.wav", "source": "fillets:cs", "language": "cs"}]
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    groups = corpus_groups(tmp_path, per_source=3)
    assert list(groups) == ["asterisk:fr", "fillets:cs"]
    lang, files = groups["asterisk:fr"]
    assert lang == "fr" and files == [tmp_path / "asterisk-fr" / f"a{i}.wav" for i in range(3)]
    assert groups["fillets:cs"] == ("cs", [tmp_path / "fillets-cs" / "c0.wav"])


@pytest.fixture(scope="module")
def tiny():
    return random_tiny_pair(seed=0, draft_layers=1)


def test_alpha_and_paired_timing_decode_the_same_tokens(tiny):
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(1))  # [2, 80, 3000]
    states = [tiny.encode(mel[i : i + 1]) for i in range(2)]
    alpha, tokens = token_alpha(tiny, states, "fr", gamma=3, max_new_tokens=24)
    assert 0.0 <= alpha < 0.5 and len(tokens) == 2  # a random draft rarely agrees
    row = measure(tiny, states, "fr", repeats=1, max_new_tokens=24)
    assert row["same"] and row["tokens"] == sum(map(len, tokens)) > 0
    assert (
        row["ar_s"] > 0 and row["exact_s"] > 0 and row["speed"] == pytest.approx(row["ar_s"] / row["exact_s"])
    )
    own = replace(tiny, draft=tiny.target)  # the target as its own draft
    assert token_alpha(own, [(t, t) for t, _ in states], "fr", gamma=3, max_new_tokens=24)[0] > 0.9
