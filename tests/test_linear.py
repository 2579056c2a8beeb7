"""CPU product forms (`specasr.backends.cpu.linear`): the packed decoder matrices compute the same
products as the Linear they replace, at every row count the loop and the eager layers use."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specasr.backends.cpu.linear import (
    FEW_ROWS,
    HalfPackedHead,
    HalfPackedLinear,
    Int8Linear,
    PackedHead,
    PackedLinear,
    fp16_exact,
    half_available,
    int8_available,
    packed_available,
    swap_linears,
)
from specasr.backends.cpu.scripted import _lin

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

    from specasr.models.whisper import pack_decoder
    from specasr.runtime.runner import LeanDecoder, LeanRunner

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


def test_the_lean_loop_runs_its_scripted_steps_unoptimised_and_restores_the_setting():
    """`LeanRunner` runs its layers inside `unoptimized_script` (no profiling runs and plans
    per input signature: start-up time, docs/benchmarks.md): the JIT's optimisation is off
    during a pass, and the caller's setting is back after it, also after an error."""
    from tiny_pairs import random_tiny_pair

    from specasr.backends import process
    from specasr.runtime.runner import LeanDecoder, LeanRunner

    target = random_tiny_pair(seed=3).target
    states = torch.randn(1, 1500, target.config.d_model, generator=torch.Generator().manual_seed(4))
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 440, 2068]])
    seen = []
    decoder = LeanDecoder(target)
    step = decoder.steps[0].fn
    assert step is not None  # this torch scripts the layers: the switch has something to act on

    def spy(*args):
        seen.append(torch._C._get_graph_executor_optimize())
        return step(*args)

    decoder.steps[0].fn = spy
    with torch.inference_mode(), torch.jit.optimized_execution(True):
        LeanRunner(decoder, states)(tokens, 6)
        assert seen == [False] and torch._C._get_graph_executor_optimize() is True
        with pytest.raises(RuntimeError), process.unoptimized_script():
            assert torch._C._get_graph_executor_optimize() is False
            raise RuntimeError("a failed pass")
        assert torch._C._get_graph_executor_optimize() is True


@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 products")
def test_the_lean_loop_calls_its_int8_steps_and_head_without_the_torch_function_probe():
    """`LeanRunner` passes run inside `plain_calls`: subclass `__torch_function__` dispatch is
    off for the scripted layers and the head (a packed int8 argument answers that probe with a
    thrown exception, costly per scripted call), on again after the pass; and the logits are
    bitwise those of the same pass with the probe on."""
    from tiny_pairs import random_tiny_pair

    from specasr.backends.process import plain_calls
    from specasr.models.draft import DistilledDraft
    from specasr.runtime.runner import LeanRunner

    t = random_tiny_pair(seed=5).target
    draft = DistilledDraft.from_target(t, (0, 1), torch.arange(0, 51865, 7)).attach(t)
    draft.quantize_int8()  # int8 layers (packed arguments) and an int8 head
    states = torch.randn(1, 1500, draft.d_model, generator=torch.Generator().manual_seed(6))
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 440, 2068]])
    seen = []
    runner = LeanRunner(draft, states)
    step, head = runner.steps[0].fn, draft.reduced_logits
    assert step is not None  # scripted: the probe would meet its packed arguments

    def spy(*args):
        seen.append(("layer", torch._C._is_torch_function_enabled()))
        return step(*args)

    def head_spy(x):
        seen.append(("head", torch._C._is_torch_function_enabled()))
        return head(x)

    with torch.inference_mode():
        runner.steps[0].fn, draft.reduced_logits = spy, head_spy
        try:
            quick = runner(tokens, 2, reduced=True)
        finally:
            runner.steps[0].fn = step
            del draft.reduced_logits
        assert seen == [("layer", False), ("head", False)]
        assert torch._C._is_torch_function_enabled()
        with pytest.raises(RuntimeError), plain_calls():
            raise RuntimeError("a failed pass")
        assert torch._C._is_torch_function_enabled()
        # the same pass with the probe on: the eager calls the loop made before
        x = draft.embed(tokens, 0)
        mask = torch.ones(6, 6, dtype=torch.bool).tril()
        runner = LeanRunner(draft, states)
        for lay, K, V, (ck, cv) in zip(draft.layers, runner.k, runner.v, runner.cross):
            x = lay(x, ck, cv, mask, cache=(K, V), start=0, write=None)
        assert torch.equal(quick, draft.reduced_logits(x[:, -2:]))


def test_every_layers_bf16_cross_kv_from_two_products_gives_the_layer_by_layer_bits(monkeypatch):
    """`LeanDecoder.cross_kv` (`CrossProducts`): for one row, one product for every layer's bf16
    keys and one for their values give each layer's K (or Kᵀ) and V bitwise as
    `DecoderLayer.cross_kv` gives them, contiguous; a batch is joined window by window, with the
    same bits; the layers' weights are views of the joined ones (nothing held twice); fp32 or
    mixed projections keep their own products."""
    from tiny_pairs import random_tiny_pair

    from specasr.backends.cpu.bf16 import Bf16Linear, bf16_cross_kv
    from specasr.runtime.runner import CrossProducts, LeanDecoder, LeanRunner

    target = random_tiny_pair(seed=7).target
    assert CrossProducts.of(target.model.decoder.layers) is None  # fp32: layer by layer
    bf16_cross_kv(target.model.decoder)
    states = torch.randn(2, 1500, target.config.d_model, generator=torch.Generator().manual_seed(8))
    decoder = LeanDecoder(target)
    joined_rows = []
    call = CrossProducts.__call__
    monkeypatch.setattr(
        CrossProducts, "__call__", lambda c, x, kt: joined_rows.append(x.shape[0]) or call(c, x, kt)
    )
    with torch.inference_mode():
        for kt, rows in ((False, 1), (False, 2), (True, 1), (True, 2)):  # batches: window by window
            want = [layer.cross_kv(states[:rows], kt) for layer in decoder.layers]
            joined_rows.clear()
            got = decoder.cross_kv(states[:rows], kt)
            assert joined_rows == [1] * rows
            assert isinstance(decoder._cross, CrossProducts) and decoder._cross is not CrossProducts.NONE
            for (k, v), (gk, gv) in zip(want, got):
                assert gk.is_contiguous() and gv.is_contiguous() and gk.dtype == gv.dtype == torch.float32
                assert torch.equal(gk, k) and torch.equal(gv, v)
        joined = decoder._cross.wk.untyped_storage().data_ptr()
        for layer in decoder.layers:
            assert layer.encoder_attn.k_proj.weight.untyped_storage().data_ptr() == joined
        runner = LeanRunner(decoder, states[:1])  # what a window's set-up now runs
        for (k, v), (rk, rv) in zip(decoder.cross_kv(states[:1], False), runner.cross):
            assert torch.equal(rk, k) and torch.equal(rv, v)
        with pytest.raises(ValueError, match="one row"):
            decoder._cross(states, False)
    dec = random_tiny_pair(seed=7).target.model.decoder
    attn = dec.layers[1].encoder_attn
    attn.k_proj = Bf16Linear.of(attn.k_proj)  # one bf16 K among fp32 projections
    assert CrossProducts.of(dec.layers) is None  # mixed: layer by layer


# ---- fp16-packed forms for few-row passes (fp16-exact weights) ---------------------------
half = pytest.mark.skipif(not half_available(), reason="this torch build has no fbgemm fp16 GEMM")


def _fp16_exact_linear(i: int, o: int, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    linear = nn.Linear(i, o, bias=bias)
    with torch.no_grad():  # values an fp16 checkpoint holds
        for p in linear.parameters():
            p.copy_(p.half().float())
    return linear


@half
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 5, 8, 200])
def test_half_packed_linear_computes_the_fp32_products(rows, bias):
    linear = _fp16_exact_linear(64, 96, bias)
    form = HalfPackedLinear.of(linear)
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(form(x), linear(x).detach(), atol=1e-5, rtol=1e-5)
    assert torch.equal(form.weight, linear.weight)  # nothing was rounded
    state = form.state_dict()
    assert set(state) == {"weight", "bias"} and torch.equal(state["weight"], linear.weight)


@half
def test_half_packed_linear_refuses_a_weight_fp16_would_round():
    linear = nn.Linear(16, 8)
    with torch.no_grad():
        linear.weight[0, 0] = 1 + 2**-20  # not an fp16 value
    assert not fp16_exact(linear.weight) and HalfPackedLinear.of(linear) is None


@half
def test_the_scripted_step_multiplies_fp16_packed_weights():
    linear = _fp16_exact_linear(64, 32, seed=2)
    x = torch.randn(5, 64)
    lin = torch.jit.script(_lin)  # as fp32_layer_step compiles it
    form = HalfPackedLinear.of(linear)
    torch.testing.assert_close(lin(x, form.step_weight, form.bias), linear(x).detach(), atol=1e-5, rtol=1e-5)


@half
def test_half_packed_head_builds_its_fp32_form_only_for_many_rows():
    table = (
        torch.randn(HalfPackedHead.BLOCK + 300, 32, generator=torch.Generator().manual_seed(3)).half().float()
    )
    head = HalfPackedHead.build(table)
    assert head is not None and len(head.blocks) == 2
    for rows in (1, 6, HalfPackedHead.FEW):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(head(x), x @ table.t(), atol=1e-4, rtol=1e-5)
    assert head.wide is None  # one window at a time never pays for the fp32 copy
    x = torch.randn(2, HalfPackedHead.FEW, 32)  # a batch of windows
    torch.testing.assert_close(head(x), x @ table.t(), atol=1e-4, rtol=1e-5)
    assert isinstance(head.wide, PackedHead)
    table[0, 0] = 1 + 2**-20
    assert HalfPackedHead.build(table) is None


@half
@pytest.mark.parametrize("script", [True, False])
def test_a_decoder_packed_with_fp16_forms_gives_the_unpacked_logits(script):
    """Packed matrices with fp16 forms (`use_few`, as `use_half_weights` adds them) on
    fp16-exact weights: passes of up to FEW_ROWS rows run the fp16-packed forms (scripted),
    bigger ones the fp32-packed; both give the unpacked logits."""
    from tiny_pairs import random_tiny_pair

    from specasr.models.whisper import pack_decoder
    from specasr.runtime.runner import LeanDecoder, LeanRunner

    plain, packed = random_tiny_pair(seed=3).target, random_tiny_pair(seed=3).target
    with torch.no_grad():
        for model in (plain, packed):
            for p in model.parameters():
                p.copy_(p.half().float())
    pack_decoder(packed)
    for m in packed.model.decoder.modules():
        if isinstance(m, PackedLinear):
            m.use_few(HalfPackedLinear.of(m))
    fc1 = packed.model.decoder.layers[0].fc1
    assert isinstance(fc1, PackedLinear) and isinstance(fc1.few, HalfPackedLinear)
    lean = LeanDecoder(packed, script=script)
    if script:
        assert lean.steps[0].few_rows == FEW_ROWS and lean.steps[0].few[4].dtype == torch.uint8
    states = torch.randn(2, 1500, plain.config.d_model, generator=torch.Generator().manual_seed(4))
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 440, 2068] + [1000 + i for i in range(40)]] * 2)
    with torch.inference_mode():
        a, b = LeanRunner(LeanDecoder(plain), states), LeanRunner(lean, states)
        # 2 rows (few), 2 × 5 = 10 rows (fp32), 2 × 35 rows (eager, above MANY_ROWS)
        for block in (tokens[:, :1], tokens[:, 1:6], tokens[:, 6:41]):
            want = a(block, block.shape[1])
            torch.testing.assert_close(b(block, block.shape[1]), want, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not int8_available(), reason="needs fbgemm's int8 linear")
def test_forms_built_on_a_pool_are_the_forms_built_in_turn():
    from concurrent.futures import ThreadPoolExecutor

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.ModuleList([nn.Linear(16, 4), nn.ReLU()]), nn.Linear(4, 3))

    in_turn = swap_linears(model(), Int8Linear.of)
    with ThreadPoolExecutor(2) as pool:
        pooled = swap_linears(model(), Int8Linear.of, pool)
    x = torch.randn(5, 8)
    for a, b in zip(in_turn.modules(), pooled.modules()):
        assert type(a) is type(b) and not isinstance(a, nn.Linear)  # every Linear was replaced
    y_turn = in_turn[2](in_turn[1][0](in_turn[0](x)))
    y_pool = pooled[2](pooled[1][0](pooled[0](x)))
    assert torch.equal(y_turn, y_pool)
