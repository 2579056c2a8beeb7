"""The coupled sampling rule (decode/race.py): every token is the target's race winner with
noise keyed by (seed, row, position), so sampled transcripts do not depend on the mode."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
import torch
from tiny_pairs import random_tiny_pair

from specasr.decode.loop import decode
from specasr.decode.race import KeyedRace, race_key, race_pick
from specasr.options import DecodeOptions, TranscribeOptions
from specasr.transcription import transcribe

SR = 16_000


def test_keys_are_stable_and_unrelated():
    assert race_key(1, 2, 3) == race_key(1, 2, 3) < 2**63
    keys = {race_key(s, r, p) for s in range(4) for r in range(4) for p in range(64)}
    assert len(keys) == 4 * 4 * 64
    race = KeyedRace(5, 11, torch.device("cpu"))
    a = race.gumbel([0, 1], [7, 7])
    assert torch.equal(a[0], race.gumbel([0], [7])[0]) and not torch.equal(a[0], a[1])
    again = KeyedRace(5, 11, torch.device("cpu")).gumbel([1], [7])  # a new decode: the same draw
    assert torch.equal(again[0], a[1])
    race.forget(0, below=8)
    assert (0, 7) not in race._held and (1, 7) in race._held


@pytest.mark.parametrize("temperature", [0.3, 1.0])
def test_the_keyed_race_samples_softmax(temperature):
    """Over many (row, position) keys, the race winners' frequencies are softmax(l / T): within
    five standard errors of each probability, for a distribution with a heavy and a light tail."""
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, -3.0])
    p = torch.softmax(logits / temperature, dim=-1)
    race = KeyedRace(42, len(logits), torch.device("cpu"))
    n = 20_000
    rows = [k % 100 for k in range(n)]
    positions = [k // 100 for k in range(n)]
    winners = race_pick(logits.expand(n, -1), temperature, race.gumbel(rows, positions))
    freq = winners.bincount(minlength=len(logits)).double() / n
    se = (p.double() * (1 - p.double()) / n).sqrt()
    assert ((freq - p.double()).abs() <= 5 * se + 1e-4).all(), (freq, p)


@pytest.fixture(scope="module")
def tiny():
    return random_tiny_pair(seed=0, draft_layers=1)


def _mels(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 80, 3000, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("temperature", [0.4, 1.0])
def test_coupled_speculation_gives_the_autoregressive_sample(tiny, temperature):
    """Random tiny models (a poor draft: many rejections), three rows, several seeds: exact and
    baseline give the autoregressive tokens token for token; the rejection rule does not."""
    mel = _mels(3)
    differs = False
    for seed in range(4):
        opts = DecodeOptions(temperature=temperature, seed=seed, max_new_tokens=24, gamma=4, draft_stop=0.0)
        ar = [r.tokens for r in decode(tiny, mel, replace(opts, mode="autoregressive"))]
        for mode in ("exact", "baseline"):
            assert [r.tokens for r in decode(tiny, mel, replace(opts, mode=mode))] == ar
        rejection = [r.tokens for r in decode(tiny, mel, replace(opts, mode="exact", sampling="rejection"))]
        differs |= rejection != ar
    assert differs  # the test can tell the rules apart


@pytest.mark.slow  # loads base and its packaged draft
def test_real_speech_sampled_through_the_fallbacks_is_the_same_in_every_mode(base_shipped, librivox):
    """A recording made to fall back (a log-prob bar no decode reaches sends every window up
    to T = 1.0): with the coupled rule, exact (packaged reduced-vocabulary draft) and
    autoregressive give the same transcript for the same seed; with the rejection rule they
    differ."""
    pair = base_shipped  # base with its packaged draft (a reduced vocabulary)
    audio = np.concatenate([sf.read(str(c.path), dtype="float32")[0] for c in librivox[:3]])
    base = replace(TranscribeOptions(logprob_threshold=0.0, no_speech_threshold=None), batch_size=2)
    texts = {}
    for sampling in ("coupled", "rejection"):
        for mode in ("autoregressive", "exact"):
            opts = base.with_decode(mode=mode, language="en", seed=3, sampling=sampling)
            segments, _ = transcribe(audio, pair, opts, source_rate=SR)
            segments = list(segments)
            assert segments and all(s.temperature == 1.0 for s in segments)
            texts[sampling, mode] = [s.tokens for s in segments]
    assert texts["coupled", "exact"] == texts["coupled", "autoregressive"]
    assert texts["rejection", "exact"] != texts["rejection", "autoregressive"]


@pytest.mark.slow  # loads base and its packaged draft
def test_real_speech_at_each_temperature_keeps_the_autoregressive_sample(base_shipped, librivox):
    from specasr.features import log_mel_window

    pair = base_shipped  # base with its packaged draft (a reduced vocabulary)

    mel = torch.cat([log_mel_window(sf.read(str(c.path), dtype="float32")[0], 80) for c in librivox[:2]])
    accepted = 0
    for temperature in (0.2, 0.6, 1.0):
        opts = DecodeOptions(temperature=temperature, seed=11, gamma=5, gamma_policy="fixed")
        ar = decode(pair, mel, replace(opts, mode="autoregressive"))
        spec = decode(pair, mel, opts)
        assert [r.tokens for r in spec] == [r.tokens for r in ar]
        accepted += spec[0].stats.accepted
    assert accepted > 0  # drafts were accepted: the identity is not target-only decoding's


def test_every_front_end_takes_the_sampling_rule(monkeypatch, librivox):
    from click.testing import CliRunner
    from specasr.apps.openai_api import ApiError, Served, parse_request

    import specasr.cli.transcribe as cli_transcribe
    from specasr.cli import main
    from specasr.options import front_end_options

    assert DecodeOptions().sampling == "coupled" and DecodeOptions().coupled
    assert not DecodeOptions(mode="sigmoid").coupled  # sigmoid keeps its approximate rule
    with pytest.raises(ValueError, match="sampling"):
        DecodeOptions(sampling="gumbel")
    assert front_end_options(sampling="rejection").decode.sampling == "rejection"
    served = Served(("base",), True, True, frozenset({"en"}))
    assert (
        parse_request([("sampling", "rejection")], "transcribe", served).options.decode.sampling
        == "rejection"
    )
    with pytest.raises(ApiError):
        parse_request([("sampling", "gumbel")], "transcribe", served)
    monkeypatch.setattr(cli_transcribe, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    result = CliRunner().invoke(main, ["transcribe", str(librivox[0].path), "--sampling", "gumbel"])
    assert result.exit_code == 2 and "--sampling" in result.output
