"""Option dataclasses: the long-form temperature must be the fallback schedule's start, and
every front end builds a consistent TranscribeOptions."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner
from specasr.apps.service import Controls
from tiny_pairs import random_tiny_pair

from specasr.cli import main
from specasr.longform import engine as engine_module
from specasr.longform import windows
from specasr.longform.engine import LocalEngine
from specasr.options import FALLBACK_TEMPERATURES, DecodeOptions, TranscribeOptions, fallback_schedule
from specasr.stats import DecodeStats

CONFLICT = "conflicts with the fallback schedule"


def test_a_temperature_off_the_schedule_is_rejected():
    with pytest.raises(ValueError, match=CONFLICT) as e:
        TranscribeOptions(decode=DecodeOptions(temperature=0.5))  # the schedule starts at 0
    assert "temperatures[0] = 0" in str(e.value) and "fallback_schedule(0.5)" in str(e.value)
    with pytest.raises(ValueError, match=CONFLICT):
        TranscribeOptions(temperatures=(0.2, 0.4))  # decode.temperature is 0
    custom = TranscribeOptions(temperatures=(0.0, 0.5))
    with pytest.raises(ValueError, match=CONFLICT):
        custom.with_decode(temperature=1.0)  # a schedule of the user's own is not moved
    with pytest.raises(ValueError, match=CONFLICT):
        replace(TranscribeOptions(), temperatures=fallback_schedule(0.4))
    with pytest.raises(ValueError, match=CONFLICT):  # a schedule step is not the start
        TranscribeOptions(decode=DecodeOptions(temperature=0.4), temperatures=(0.2, 0.4, 0.6))


@pytest.mark.parametrize("t", [0.0, 0.2, 0.5, 1.0])
def test_a_temperature_at_the_start_of_the_schedule_is_accepted(t):
    opts = TranscribeOptions(decode=DecodeOptions(temperature=t), temperatures=fallback_schedule(t))
    assert opts.temperatures[0] == opts.decode.temperature == t
    assert TranscribeOptions(decode=DecodeOptions(temperature=t), temperatures=(t,)).temperatures == (t,)
    base = TranscribeOptions()
    assert base.temperatures == FALLBACK_TEMPERATURES and base.decode.temperature == 0.0
    moved = replace(base, decode=replace(base.decode, temperature=t), temperatures=fallback_schedule(t))
    assert moved.with_decode(mode="autoregressive").decode.temperature == t  # other fields: no conflict


def test_with_decode_replaces_decode_fields_only():
    base = TranscribeOptions(strategy="chunked", batch_size=3)
    opts = base.with_decode(mode="autoregressive", seed=5)
    assert opts == replace(base, decode=replace(base.decode, mode="autoregressive", seed=5))
    assert (opts.strategy, opts.batch_size, opts.decode.timestamps) == ("chunked", 3, True)


def test_the_transcribe_command_builds_a_consistent_schedule(monkeypatch, librivox):
    module = importlib.import_module("specasr.cli.transcribe")  # specasr.cli.transcribe is the command
    seen = []

    class Batch:
        def __init__(self, pair, options, *args, **kwargs):
            seen.append(options)
            self.failed = 0

        def run(self, files):
            pass

        def summary(self):
            return ""

    monkeypatch.setattr(module, "load_models", lambda *args, **kwargs: "pair")
    monkeypatch.setattr(module, "Batch", Batch)
    for t in ("0", "0.4", "1.0"):
        args = ["transcribe", str(librivox[0].path), "--temperature", t, "--seed", "3"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        opts = seen[-1]
        assert opts.decode.temperature == float(t) and opts.temperatures == fallback_schedule(float(t))
        assert opts.decode.seed == 3


@pytest.mark.parametrize("t", [0.0, 0.5, 1.0])
def test_the_app_controls_build_a_consistent_schedule(t):
    opts = Controls(temperature=t).options()
    assert opts.decode.temperature == opts.temperatures[0] == t


def test_the_eval_runners_long_form_options_are_consistent():
    # Evaluator._decode_group: one temperature, no fallback, for a > 30 s utterance
    for options in (DecodeOptions(), DecodeOptions(temperature=1.0)):
        topts = TranscribeOptions(
            decode=replace(options, timestamps=True), temperatures=(options.temperature,)
        )
        assert topts.temperatures == (options.temperature,)


def test_fallback_sets_temperature_language_and_seed_per_window(monkeypatch):
    """decode_with_fallback decodes at each schedule step, in the window's language and with
    the window's seed, whatever `options.decode` holds for those three."""
    pair = random_tiny_pair(seed=0)
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(1))  # [2, 80, 3000]
    stats = DecodeStats()
    t_states, d_states = windows.encode_windows(LocalEngine(pair), mel, stats)
    seen = []
    real = engine_module.decode_states

    def spy(pair, target_states, draft_states, options, prompt=None, stats=None):
        seen.append((options, target_states.shape[0]))
        return real(pair, target_states, draft_states, options, prompt, stats)

    monkeypatch.setattr(engine_module, "decode_states", spy)
    monkeypatch.setattr(windows, "needs_fallback", lambda result, options: True)  # every step runs
    decode = DecodeOptions(mode="exact", timestamps=True, max_new_tokens=6, language=None, seed=0)
    opts = TranscribeOptions(decode=decode, temperatures=(0.0, 0.4, 0.8))
    results = windows.decode_with_fallback(LocalEngine(pair), t_states, d_states, opts, "de", None, 41, stats)
    assert [r.temperature for r in results] == [0.8, 0.8]
    assert [(o.temperature, o.language, o.seed, rows) for o, rows in seen] == [
        (0.0, "de", 41, 2),
        (0.4, "de", 41, 2),
        (0.8, "de", 41, 2),
    ]
    assert all(o.mode == "exact" and o.max_new_tokens == 6 for o, _ in seen)  # the rest as given


def test_draft_prompt_is_a_count_or_none():
    assert (
        DecodeOptions(draft_prompt=0).draft_prompt == 0
        and DecodeOptions(draft_prompt=None).draft_prompt is None
    )
    with pytest.raises(ValueError, match="draft_prompt"):
        DecodeOptions(draft_prompt=-1)


def test_with_decode_moves_whispers_schedule_to_a_new_temperature():
    """A new temperature starts the default schedule there, as faster-whisper's `temperature`
    does; the detected language is the long-form default, as on the CLI."""
    opts = TranscribeOptions().with_decode(temperature=0.2)
    assert (opts.decode.temperature, opts.temperatures) == (0.2, (0.2, 0.4, 0.6, 0.8, 1.0))
    assert opts.with_decode(temperature=0.0).temperatures == fallback_schedule(0.0)
    assert TranscribeOptions().with_decode(mode="autoregressive").temperatures == fallback_schedule(0.0)
    assert TranscribeOptions().decode.language is None and DecodeOptions().language == "en"
