"""The int8 target (`compute_type="int8"`): per-row int8 products that do not depend on the
rows beside them, a decoder that runs them (scripted and eager alike), how the compute type
is chosen, and that speculative modes refuse an int8 target instead of losing exactness."""

from __future__ import annotations

import copy

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from specasr.cpu.linear import Int8Head, Int8Linear, int8_available
from specasr.models.loading import resolve_compute_type

pytestmark = pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 linear")


def _linear(n_in: int = 64, n_out: int = 96, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out)


def test_a_per_row_int8_product_does_not_depend_on_the_other_rows():
    """Each row's result is bitwise the same alone, in any batch and with rows of any scale
    beside it (per-call quantisation, the draft's, is not: shown as the contrast)."""
    lin = _linear()
    x = torch.randn(9, 64)
    x[3] *= 50  # a loud row sets a per-call scale for every row
    per_row, per_call = Int8Linear.per_row_of(lin), Int8Linear.of(lin)
    alone = torch.cat([per_row(x[i : i + 1]) for i in range(9)])
    assert torch.equal(per_row(x), alone)
    assert torch.equal(per_row(x[[5, 0, 8]]), alone[[5, 0, 8]])
    assert torch.equal(per_row(x.view(3, 3, 64)).view(9, 96), alone)
    assert not torch.equal(per_call(x), torch.cat([per_call(x[i : i + 1]) for i in range(9)]))


def test_a_per_row_int8_product_is_close_to_fp32_and_adds_its_bias():
    lin = _linear(512, 256, seed=1)
    x = torch.randn(7, 512)
    want = lin(x).detach()
    got = Int8Linear.per_row_of(lin)(x)
    assert ((got - want).norm() / want.norm()).item() < 0.03  # 7-bit weights, 8-bit rows
    zero = Int8Linear.per_row_of(lin)(torch.zeros(2, 512))  # an all-zero row: just the bias
    torch.testing.assert_close(zero, lin.bias.detach().expand(2, -1))


@pytest.mark.parametrize("levels", [63, 127])  # an int8 target's rows, a draft's
def test_row_quantisation_gives_quantize_per_channel_values_bitwise(levels):
    """`_quantize_rows` computes in plain ops, block by block, what torch.quantize_per_channel
    computes (the values every earlier int8 draft and target ran with): rows of scales from
    1e-6 to 1e2 over three blocks, and rows whose values sit exactly on .5 steps of their
    scale (round half to even)."""
    import warnings

    from specasr.cpu.linear import _QUANT_BLOCK, _quantize_rows

    g = torch.Generator().manual_seed(0)
    n = 2 * _QUANT_BLOCK + 7  # rows over three blocks
    w = torch.randn(n, 40, generator=g) * 10.0 ** torch.randint(-6, 3, (n, 1), generator=g).float()
    ties = (torch.arange(-40, 41, dtype=torch.float32) + 0.5)[None, :].repeat(3, 1)
    ties[:, 0] = levels  # max |w| = levels: the scale is 1, and every other value is a tie
    for weight in (w, ties):
        q, scale = _quantize_rows(weight, levels)
        zero = torch.zeros(weight.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            want = torch.quantize_per_channel(weight, scale, zero, 0, torch.qint8).int_repr()
        assert q.dtype == torch.int8 and torch.equal(q, want)
        assert int(q.abs().max()) <= levels


def test_the_int8_head_is_the_per_row_product_of_its_table():
    table = nn.Parameter(torch.randn(96, 64), requires_grad=False)
    head = Int8Head(table)
    x = torch.randn(4, 64)
    assert head.weight is table
    assert torch.equal(head(x), Int8Linear(table, None, per_row=True)(x))


@pytest.mark.parametrize("runner", ["lean scripted", "lean eager", "whisper layers"])
def test_an_int8_decoder_is_close_to_fp32_and_its_scripted_steps_are_bitwise_the_eager_layers(runner):
    """`quantize_target`: every decoder path runs the per-row products. The scripted lean
    layers give exactly the eager lean layers' logits (the same ops); all are close to the
    fp32 model's."""
    from tiny_pairs import random_tiny_pair

    from specasr.cpu.lean import LeanDecoder, LeanRunner
    from specasr.models.whisper import quantize_target

    plain = random_tiny_pair(seed=3).target
    q8 = quantize_target(copy.deepcopy(plain))
    layer = q8.model.decoder.layers[0]
    assert isinstance(layer.fc1, Int8Linear) and layer.fc1.per_row and hasattr(layer.self_attn, "qkv_proj")
    assert isinstance(layer.encoder_attn.k_proj, nn.Linear)  # cross K/V: once per window, fp32
    assert not any(isinstance(m, Int8Linear) for m in q8.model.encoder.modules())  # cost speech
    make = {
        "lean scripted": lambda m, s: LeanRunner(LeanDecoder(m), s),
        "lean eager": lambda m, s: LeanRunner(LeanDecoder(m, script=False), s),
        "whisper layers": lambda m, s: LeanRunner(m.model.decoder, s),
    }
    states = torch.randn(2, 1500, plain.config.d_model, generator=torch.Generator().manual_seed(4))
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 440, 2068]] * 2)
    with torch.inference_mode():
        ref, mine, eager = make["whisper layers"](plain, states), make[runner](q8, states), None
        if runner == "lean scripted":
            eager = make["lean eager"](q8, states)
        for block in (tokens[:, :1], tokens[:, 1:6], tokens[:, 5:6]):
            want, got = ref(block, block.shape[1]), mine(block, block.shape[1])
            assert ((got - want).norm() / want.norm()).item() < 0.05
            if eager is not None:
                assert torch.equal(got, eager(block, block.shape[1]))


def test_the_compute_type_is_resolved_and_int8_needs_a_cpu_in_fp32():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_compute_type("float32", cpu, torch.float32) == "float32"
    assert resolve_compute_type("int8", cpu, torch.float32) == "int8"
    assert resolve_compute_type("auto", cpu, torch.float32, speculative=True) == "float32"
    simd = torch.backends.cpu.get_cpu_capability().startswith("AVX")
    assert resolve_compute_type("auto", cpu, torch.float32) == ("int8" if simd else "float32")
    assert resolve_compute_type("auto", cuda, torch.float16) == "float32"
    for device, dtype in ((cpu, torch.bfloat16), (cuda, torch.float16)):
        with pytest.raises(ValueError, match="int8 runs on a CPU in fp32"):
            resolve_compute_type("int8", device, dtype)
    with pytest.raises(ValueError, match="expected one of"):
        resolve_compute_type("int4", cpu, torch.float32)


def test_speculative_modes_refuse_an_int8_target(tmp_path):
    """Exactness is not given up quietly: decoding refuses, and the CLI says so (exit 2)
    before any model loads."""
    from dataclasses import replace

    from tiny_pairs import random_tiny_pair

    from specasr.cli import main
    from specasr.decode.loop import decode_states
    from specasr.options import DecodeOptions

    tiny = random_tiny_pair(seed=3)
    pair = replace(tiny, compute_type="int8")
    states = torch.zeros(1, 1500, tiny.target.config.d_model)
    with pytest.raises(ValueError, match="decodes autoregressively only"):
        decode_states(pair, states, states, DecodeOptions(mode="exact"))
    wav = tmp_path / "x.wav"
    wav.write_bytes(b"")
    for args in (
        ["transcribe", str(wav), "--compute-type", "int8"],  # the default mode is exact
        ["eval", "librispeech-clean", "--data-dir", str(tmp_path), "--compute-type", "int8"],
    ):
        result = CliRunner().invoke(main, args)
        assert (
            result.exit_code == 2
            and "--compute-type int8 decodes with --mode autoregressive only" in result.output
        )


@pytest.mark.slow
def test_base_in_int8_transcribes_the_clips_as_fp32_does(librivox):
    """Real weights: an int8 base is a different model, but on the LibriVox clips its
    transcripts stay within a point of fp32's WER, and it reports its compute type."""
    from specasr.eval.metric import wer
    from specasr.models.loading import load_pair
    from specasr.options import DecodeOptions
    from specasr.transcription import transcribe_clip

    texts = {}
    for ct in ("float32", "int8"):
        pair = load_pair("base", None, compute_type=ct)
        assert pair.compute_type == ct
        texts[ct] = [
            transcribe_clip(pair, c.path, DecodeOptions(mode="autoregressive")).text for c in librivox
        ]
    refs = [c.text for c in librivox]
    assert wer(refs, texts["int8"]) <= wer(refs, texts["float32"]) + 0.01
    assert sum(a == b for a, b in zip(texts["int8"], texts["float32"])) >= len(librivox) - 1
