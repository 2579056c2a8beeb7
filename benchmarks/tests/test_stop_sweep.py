"""stop_sweep: the replay of the speculative loop that picks γ and the draft-confidence stop."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
import torch
from tiny_pairs import random_tiny_pair

from benchmarks.stop_sweep import simulate, sweep, teacher_forced
from specasr.decode.loop import decode_states
from specasr.decode.task import start_sequence
from specasr.options import DecodeOptions

V = {1: 1.0, 2: 1.2, 3: 1.3, 4: 1.35, 5: 1.4, 6: 1.5}
C = 0.25


def test_a_confident_always_right_draft_runs_to_gamma():
    window = [(0.9, True)] * 10
    # two passes of 4 proposals, each accepting all 4 and adding one token
    assert simulate([window], 4, 0.5, C, V) == pytest.approx(10 / (2 * (4 * C + V[5])))
    assert simulate([window], 4, 0.0, C, V) == simulate([window], 4, 0.5, C, V)


def test_the_stop_ends_runs_at_unsure_proposals_and_pays_off_when_they_are_wrong():
    window = [(0.9, True), (0.1, False)] * 6  # every second token is a wrong, unsure proposal
    # stop 0.5: propose 2 (the unsure one is still offered), accept 1, add 1: 2 tokens for 2c + v(3)
    assert simulate([window], 4, 0.5, C, V) == pytest.approx(12 / (6 * (2 * C + V[3])))
    # no stop: 4 proposals for the same 2 tokens; the last pass has only 2 positions left
    assert simulate([window], 4, 0.0, C, V) == pytest.approx(12 / (5 * (4 * C + V[5]) + 2 * C + V[3]))
    # a stop that fires on confident, right proposals only loses
    right_but_unsure = [(0.3, True)] * 10
    assert simulate([right_but_unsure], 4, 0.5, C, V) < simulate([right_but_unsure], 4, 0.0, C, V)


def test_the_last_pass_emits_only_what_is_left():
    window = [(0.9, True)] * 3
    assert simulate([window], 5, 0.0, C, V) == pytest.approx(3 / (3 * C + V[4]))


def test_sweep_covers_the_grid_and_finds_its_best_cells():
    window = []  # runs of right, confident proposals of uneven length, each ended by a wrong, unsure one
    for run in (1, 5, 2, 4, 1, 5, 3) * 3:
        window += [(0.9, True)] * run + [(0.2, False)]
    result = sweep([window], [2, 3, 4, 5], [0.0, 0.5], C, V)
    assert set(result.rates) == {(g, t) for g in (2, 3, 4, 5) for t in (0.0, 0.5)}
    assert result.best() == max((r, g, t) for (g, t), r in result.rates.items())
    assert result.best(threshold=0.0) == max((r, g, 0.0) for (g, t), r in result.rates.items() if t == 0.0)
    assert result.best(threshold=0.0)[0] < result.best()[0]  # every unsure proposal is wrong: stopping pays
    assert result.table().count("\n") == 1 + 4  # header, rule, one row per γ


@pytest.fixture(scope="module")
def tiny():
    return random_tiny_pair(seed=0, draft_layers=1)


def _window(pair):
    mel = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(3))  # [1, 80, 3000]
    states, _ = pair.encode(mel)
    opts = DecodeOptions(mode="autoregressive", max_new_tokens=20)
    label = decode_states(pair, states, None, opts)[0].tokens
    init, _ = start_sequence(pair, opts, "en", None)
    return states, init, label


def test_teacher_forced_positions_line_up_with_the_targets_tokens(tiny):
    states, init, label = _window(tiny)
    own = teacher_forced(replace(tiny, draft=tiny.target), states, init, label, False)
    assert len(own) == len(label) + 1  # every label token and the closing eot
    # the target as its own draft agrees everywhere (but at the eot, if the label ran to the limit)
    assert all(ok for _, ok in own[: len(label) + (len(label) < 20)])
    assert all(0 < q <= 1 for q, _ in own)
    other = teacher_forced(tiny, states, init, label, False)  # a random draft mostly does not
    assert sum(ok for _, ok in other) < len(other) / 2


def test_from_audio_reports_an_unreadable_file_and_goes_on(tiny, tmp_path):
    from benchmarks.stop_sweep import from_audio

    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all")
    good = tmp_path / "quiet.wav"
    sf.write(good, np.zeros(16000, np.float32), 16000)
    said = []
    windows = from_audio(tiny, [bad, good], log=said.append)
    assert len(windows) == 1 and len(windows[0]) >= 1  # the readable file's one window
    assert len(said) == 1 and "bad.wav" in said[0]


def test_held_out_windows_are_the_ones_distill_training_held_out(tiny, tmp_path):
    """`--held-out WORK` replays exactly the examples `train` kept out (same split, same
    prompts and timestamp mode as the teacher stage stored them)."""
    import json
    from dataclasses import asdict

    from specasr.recipes.distill_draft import DistillOptions, Example, split_examples

    from benchmarks.stop_sweep import from_work

    states, _, label = _window(tiny)
    examples, expected_ts = [], []
    for i, (ts, prompt) in enumerate([(False, None), (True, None), (False, [11, 12, 13]), (True, [14])]):
        opts = DecodeOptions(mode="autoregressive", timestamps=ts)
        init, _ = start_sequence(tiny, opts, "en", prompt)
        seq = init + label[: 5 + i] + [tiny.tokenizer.eot]
        empty = torch.zeros(0)
        examples.append(
            Example(state=i % 2, seq=seq, begin=len(init), top_idx=empty, top_p=empty, label=empty)
        )
        expected_ts.append(ts)
    opts = DistillOptions(holdout=0.5, seed=3)
    (tmp_path / "options.json").write_text(json.dumps(asdict(opts)))  # as `distill` writes it
    table = torch.cat([states, -states]).half()  # [2, 1500, d], stored fp16 like the teacher stage
    torch.save({"key": {}, "states": table, "examples": examples}, tmp_path / "teacher.pt")

    got = from_work(tiny, tmp_path)
    held, train_set = split_examples(examples, opts)
    assert len(got) == len(held) == 2 and len(train_set) == 2
    for ex, positions in zip(held, got):
        i = examples.index(ex)
        want = teacher_forced(
            tiny, table[ex.state : ex.state + 1], ex.seq[: ex.begin], label[: 5 + i], expected_ts[i]
        )
        assert positions == want and len(positions) == 5 + i + 1  # every label token and the eot


def test_cli_needs_inputs_or_a_held_out_work_dir(tmp_path):
    from click.testing import CliRunner

    from benchmarks.stop_sweep import main

    assert CliRunner().invoke(main, []).exit_code == 2
    result = CliRunner().invoke(main, ["--held-out", str(tmp_path)])
    assert result.exit_code == 2 and "teacher.pt" in result.output
    bad = CliRunner().invoke(main, ["--corpus", str(tmp_path), "--compute-type", "int4"])
    assert bad.exit_code == 2 and "int8_bfloat16" in bad.output  # the choices, before any model work
