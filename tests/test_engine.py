"""The engine that does a transcription's model work (specasr/longform/engine.py): a
`SharedEngine` decodes greedy passes of concurrent transcriptions as rows of one batch, and a
transcription gets the tokens it gets alone."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import with_self_draft
from tiny_pairs import random_tiny_pair

from specasr.longform import engine as engine_module
from specasr.longform.engine import EngineClosed, LocalEngine, SharedEngine
from specasr.options import front_end_options
from specasr.stats import DecodeStats
from specasr.transcription import transcribe


def _transcribe_all(pair, audios, options, engine=None):
    """Each audio transcribed in its own thread (through `engine`, or alone) -> texts, in order."""
    texts: list[str | None] = [None] * len(audios)
    errors = []

    def one(i):
        try:
            if engine is None:
                segments, _ = transcribe(audios[i], pair, options)
                texts[i] = "".join(s.text for s in segments)
                return
            with engine.client():
                segments, _ = transcribe(audios[i], pair, options, engine=engine)
                texts[i] = "".join(s.text for s in segments)
        except Exception as e:  # noqa: BLE001 (reported by the test)
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(audios))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return texts


@pytest.mark.slow
def test_concurrent_transcriptions_decode_together_and_keep_their_tokens(tiny_en_pair, librivox):
    """8 transcriptions of different lengths at once: the engine ran decode batches of
    several rows, and every transcript is the one a transcription alone gives (T = 0)."""
    pair = with_self_draft(tiny_en_pair, 2)
    audios = [c.path for c in librivox] + [c.path for c in librivox[:3]]  # 8, five lengths
    options = front_end_options(language="en")
    alone = [_transcribe_all(pair, [a], options)[0] for a in audios[:5]]
    engine = SharedEngine(pair, max_rows=16, gather_s=0.05)
    try:
        shared = _transcribe_all(pair, audios, options, engine)
    finally:
        engine.close()
    assert shared == alone + alone[:3]
    assert max(engine.batches) > 1  # windows of different requests shared a batch
    assert all(t.strip() for t in shared)


def test_sampled_passes_and_encodes_run_alone_greedy_ones_share(monkeypatch):
    """Decodes at T > 0 draw from their own seed's generator, so each runs alone; greedy ones
    with equal options and prompt share a batch; another prompt keeps its own batch."""
    pair = random_tiny_pair(seed=0)
    calls = []
    real = engine_module.decode_states

    def spy(pair, target_states, draft_states, options, prompt=None, stats=None):
        calls.append((options.temperature, target_states.shape[0], tuple(prompt or ())))
        return real(pair, target_states, draft_states, options, prompt, stats)

    monkeypatch.setattr(engine_module, "decode_states", spy)
    engine = SharedEngine(pair, gather_s=5.0)  # waits for all three registered clients
    mel = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(1))  # [1, 80, 3000]
    states = LocalEngine(pair).encode(mel, DecodeStats())
    base = front_end_options(language="en").decode
    opts = replace(base, mode="exact", max_new_tokens=4)
    jobs = [
        (replace(opts, seed=1), None),
        (replace(opts, seed=2), None),  # the seed does not matter at T = 0
        (replace(opts, seed=3), [50, 51]),  # another prompt
    ]
    results = [None] * 3
    barrier = threading.Barrier(3)

    def one(i):
        with engine.client():
            barrier.wait()
            results[i] = engine.decode(*states, jobs[i][0], jobs[i][1], DecodeStats())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(calls) == [(0.0, 1, (50, 51)), (0.0, 2, ())]
    assert results[0][0].tokens == results[1][0].tokens
    calls.clear()
    hot = replace(opts, temperature=0.8)
    with engine.client():
        engine.decode(*states, hot, None, DecodeStats())
    assert calls == [(0.8, 1, ())]
    engine.close()


def test_errors_reach_their_caller_and_a_closed_engine_refuses_work():
    pair = random_tiny_pair(seed=0)
    engine = SharedEngine(pair, gather_s=0.0)
    with pytest.raises(ValueError, match="mel frames"):  # raised in the engine thread, seen here
        engine.encode(torch.zeros(1, 80, 10), DecodeStats())
    states = engine.encode(torch.zeros(1, 80, 3000), DecodeStats())  # the engine still serves
    assert states[0].shape[0] == 1
    engine.close()
    with pytest.raises(EngineClosed):
        engine.encode(torch.zeros(1, 80, 3000), DecodeStats())


def test_transcribe_refuses_an_engine_of_another_pair():
    pair, other = random_tiny_pair(seed=0), random_tiny_pair(seed=2)
    with pytest.raises(ValueError, match="another pair"):
        options = front_end_options(language="en")
        transcribe(np.zeros(16000, np.float32), pair, options, engine=LocalEngine(other))


def test_engine_options_are_checked():
    pair = random_tiny_pair(seed=0)
    with pytest.raises(ValueError):
        SharedEngine(pair, max_rows=0)
