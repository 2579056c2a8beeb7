"""CPU product forms (`specasr.cpu.linear`): the packed decoder matrices compute the same
products as the Linear they replace, at every row count the loop and the eager layers use."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specasr.cpu.linear import PackedLinear, packed_available
from specasr.cpu.scripted import _lin

pytestmark = pytest.mark.skipif(not packed_available(), reason="this torch build has no oneDNN linear")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 64), (8, 64), (3, 5, 64), (200, 64)])
def test_packed_linear_equals_the_linear_it_replaces(shape, bias):
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=bias)
    packed = PackedLinear.of(linear)
    x = torch.randn(*shape)
    torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)
    assert packed(x).shape == (*shape[:-1], 96)


def test_packed_linear_keeps_the_exact_weight_and_saves_it_dense():
    linear = nn.Linear(32, 48)
    packed = PackedLinear.of(linear)
    assert torch.equal(packed.weight, linear.weight) and packed.weight.layout == torch.strided
    state = packed.state_dict()
    assert set(state) == {"weight", "bias"} and torch.equal(state["weight"], linear.weight)
    assert [n for n, _ in packed.named_parameters()] == ["bias"]  # the only dense tensor it holds


def test_the_scripted_step_multiplies_packed_and_transposed_weights_alike():
    torch.manual_seed(1)
    linear = nn.Linear(64, 32)
    x = torch.randn(5, 64)
    want = linear(x).detach()
    packed = PackedLinear.of(linear)
    lin = torch.jit.script(_lin)  # as fp32_layer_step compiles it
    for w in (packed.step_weight, linear.weight.detach().t().contiguous()):
        torch.testing.assert_close(lin(x, w, linear.bias.detach()), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lin(x, w, None), want - linear.bias.detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("runner", ["lean scripted", "lean eager", "whisper layers"])
def test_a_packed_decoder_gives_the_unpacked_logits(runner):
    """`pack_decoder` (what load_whisper does on a CPU in fp32) keeps the decoder's function:
    the lean loop's scripted and eager layers, and the model's own layers, over 1 and 5 new
    tokens, agree with the unpacked model."""
    from tiny_pairs import random_tiny_pair

    from specasr.cpu.lean import LeanDecoder, LeanRunner
    from specasr.models.whisper import pack_decoder

    plain, packed = random_tiny_pair(seed=3).target, random_tiny_pair(seed=3).target
    pack_decoder(packed)
    assert isinstance(packed.model.decoder.layers[0].fc1, PackedLinear)
    make = {
        "lean scripted": lambda m, s: LeanRunner(LeanDecoder(m), s),
        "lean eager": lambda m, s: LeanRunner(LeanDecoder(m, script=False), s),
        "whisper layers": lambda m, s: LeanRunner(m.model.decoder, s),
    }[runner]
    states = torch.randn(2, 1500, plain.config.d_model, generator=torch.Generator().manual_seed(4))
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 440, 2068]] * 2)
    with torch.inference_mode():
        a, b = make(plain, states), make(packed, states)
        for block in (tokens[:, :1], tokens[:, 1:6]):  # one token, then a verify-sized pass
            want = a(block, block.shape[1])
            torch.testing.assert_close(b(block, block.shape[1]), want, atol=1e-4, rtol=1e-4)
