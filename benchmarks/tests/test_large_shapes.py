"""`benchmarks.large_shapes`: the projection's arithmetic and the table, on a small stand-in."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from benchmarks.large_shapes import LARGE_V3, main, projection, random_models
from specasr.decode.gamma import expected_tokens


def test_free_drafts_and_verification_project_the_expected_tokens_per_pass():
    v = {k: 1.0 for k in range(1, 10)}
    bound, g, window = projection(0.8, 0.0, v, enc=0.0, t1=1.0, tokens=100)
    assert g == 8 and bound == pytest.approx(expected_tokens(0.8, 8))
    assert window == pytest.approx(bound)  # no encoder: the window gains what the decoder does
    _, _, with_encoder = projection(0.8, 0.0, v, enc=1000.0, t1=1.0, tokens=100)
    assert 1 < with_encoder < bound  # the encoder's pass is not sped up


def test_the_models_have_the_shapes_asked_for():
    import torch

    target, draft = random_models(
        dict(
            LARGE_V3,
            d_model=32,
            encoder_layers=1,
            decoder_layers=3,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
        ),
        torch.device("cpu"),
        torch.float32,
    )
    assert len(target.decoder.layers) == 3 and len(draft.decoder.layers) == 2
    assert target.proj_out.weight.shape == (51866, 32) and target.config.num_mel_bins == 128


def test_the_table_on_a_small_stand_in():
    out = CliRunner().invoke(
        main, ["--device", "cpu", "--shapes", "small", "--batch", "1", "--alphas", "0.9"]
    )
    assert out.exit_code == 0, out.output
    assert "projections, not measurements" in out.output
    c = re.search(r"c = ([0-9.]+)", out.output)
    assert c and 0 < float(c.group(1)) < 1, out.output  # 2 draft layers cost less than 4
    assert re.search(r"projected at per-token α 0.90 \| decoder [0-9.]+× at γ \d", out.output)
