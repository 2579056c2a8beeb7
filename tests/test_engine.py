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
from specasr.runtime.runner import LeanDecoder, lean_decoder
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


def _count_projections(monkeypatch, pair) -> list[int]:
    """Counts the target's cross K/V projections (`LeanDecoder.cross_kv`): rows per call."""
    rows, real, target = [], LeanDecoder.cross_kv, lean_decoder(pair.target)

    def spy(self, states, kt):
        if self is target:  # (the tiny pair's draft has an encoder and a decoder of its own)
            rows.append(states.shape[0])
        return real(self, states, kt)

    monkeypatch.setattr(LeanDecoder, "cross_kv", spy)
    return rows


def test_a_windows_detection_decode_and_fallbacks_project_its_frames_once(monkeypatch):
    """Language detection, the greedy decode and a sampled fallback of one window read one
    projection of its encoder frames, and decode exactly as if each had projected its own."""
    pair = random_tiny_pair(seed=0)
    assert pair.tokenizer.multilingual  # detection runs the target
    engine = LocalEngine(pair)
    mel = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(4))  # [1, 80, 3000]
    target, draft = engine.encode(mel, DecodeStats())
    opts = replace(front_end_options().decode, mode="exact", max_new_tokens=6)
    fresh = []
    for temperature in (0.0, 0.8):  # each on its own copy of the states: projected anew
        o = replace(opts, language="en", temperature=temperature)
        copy = target.clone()
        fresh.append(engine.decode(copy, copy if draft is target else draft.clone(), o, None, DecodeStats()))
    rows = _count_projections(monkeypatch, pair)
    language = engine.detect(target)
    got = [
        engine.decode(target, draft, replace(opts, language="en", temperature=t), None, DecodeStats())
        for t in (0.0, 0.8)
    ]
    assert language and rows == [1]
    for a, b in zip(got, fresh):
        assert (a[0].tokens, a[0].avg_logprob) == (b[0].tokens, b[0].avg_logprob)


def test_a_shared_batch_reads_the_projections_its_windows_detection_made(monkeypatch):
    """Two requests detect their language, then decode as rows of one batch: the batch joins
    their projections instead of projecting 2 rows again, and each gets its tokens alone."""
    pair = random_tiny_pair(seed=0)
    local = LocalEngine(pair)
    mels = [torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(s)) for s in (5, 6)]
    states = [local.encode(m, DecodeStats()) for m in mels]
    opts = replace(front_end_options().decode, mode="exact", max_new_tokens=6, language="en")
    alone = [
        local.decode(t.clone(), None, replace(opts, mode="autoregressive"), None, DecodeStats())
        for t, _ in states
    ]
    rows = _count_projections(monkeypatch, pair)
    engine = SharedEngine(pair, gather_s=5.0)  # waits for both registered clients
    results = [None, None]
    barrier = threading.Barrier(2)

    def one(i):
        with engine.client():
            engine.detect(states[i][0])
            barrier.wait()
            results[i] = engine.decode(*states[i], opts, None, DecodeStats())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.close()
    assert engine.batches == [2] and rows == [1, 1]  # the detections' projections only
    assert [r[0].tokens for r in results] == [a[0].tokens for a in alone]


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


@pytest.mark.parametrize("strategy", ["sequential", "chunked"])
def test_word_alignment_runs_on_the_engine_thread(monkeypatch, strategy):
    """A transcription's word alignment is model work like its decodes: a `SharedEngine` runs
    it on its own thread, the one thread whose torch work spans the cores; a `LocalEngine` runs
    it in the caller's."""
    from specasr.longform.words import WordTimer

    seen: list[str] = []
    add = WordTimer.add

    def recording(self, *args, **kwargs):
        seen.append(threading.current_thread().name)
        return add(self, *args, **kwargs)

    monkeypatch.setattr(WordTimer, "add", recording)
    pair = random_tiny_pair(seed=0)
    audio = np.random.default_rng(0).standard_normal(3 * 16000).astype(np.float32) * 0.1
    options = replace(front_end_options(language="en", word_timestamps=True), strategy=strategy)
    engine = SharedEngine(pair, gather_s=0.0)
    try:
        with engine.client():
            segments, _ = transcribe(audio, pair, options, source_rate=16000, engine=engine)
            shared = list(segments)
    finally:
        engine.close()
    assert shared and seen and set(seen) == {"specasr-engine"}
    seen.clear()
    alone = list(transcribe(audio, pair, options, source_rate=16000)[0])
    assert seen and set(seen) == {threading.current_thread().name}
    assert [s.words for s in alone] == [s.words for s in shared]
