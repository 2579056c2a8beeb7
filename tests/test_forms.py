"""Layer forms (`specasr.runtime.forms`): one reference layer, the faster forms chosen once at
load and passed to the runner; no attribute is ever assigned to a layer after construction."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from specasr.backends.cpu import bf16
from specasr.backends.cpu.linear import int8_available
from specasr.runtime.forms import EAGER, SCRIPTED_FP32, SCRIPTED_INT8, choose
from specasr.runtime.layers import PARTS, DecoderLayer
from specasr.runtime.runner import LeanDecoder, lean_decoder


def _fresh_keys() -> set[str]:
    """The instance attributes a DecoderLayer's constructor sets."""
    return set(vars(DecoderLayer(8, 2, 16, device="meta")))


def unchanged_after_construction(layer: DecoderLayer) -> list[str]:
    """What was assigned to `layer` or its class after construction: instance attributes a
    constructor does not set, submodules other than the reference's parts, and data (not
    methods) on the class. Empty when nothing was."""
    found = sorted(set(vars(layer)) - _fresh_keys())
    found += [f"module {name}" for name in layer._modules if name not in PARTS]
    found += [
        f"class {k}" for k, v in vars(type(layer)).items() if not k.startswith("__") and not callable(v)
    ]
    return found


def _layers(pair) -> list[DecoderLayer]:
    """Every decoder layer a loaded pair holds: the target model's own, its CPU view's, the draft's."""
    out = list(pair.target.model.decoder.layers)
    if LeanDecoder.supports(pair.target):
        out += list(lean_decoder(pair.target).layers)
    if pair.draft is not None:
        layers = getattr(pair.draft, "layers", None)
        out += list(layers if layers is not None else pair.draft.model.decoder.layers)
    return out


def test_the_check_finds_an_attribute_patched_onto_a_layer():
    layer = DecoderLayer(8, 2, 16, device="meta")
    assert unchanged_after_construction(layer) == []
    layer.fixed_rows = 4  # what the loader used to do
    layer.add_module("extra", torch.nn.Identity())
    assert unchanged_after_construction(layer) == ["fixed_rows", "module extra"]
    DecoderLayer._step_rows = 8  # a class attribute set from outside
    try:
        assert "class _step_rows" in unchanged_after_construction(DecoderLayer(8, 2, 16, device="meta"))
    finally:
        del DecoderLayer._step_rows


def _compute_types() -> list[str]:
    types = ["float32"]
    if int8_available():
        types.append("int8")
    if bf16.available():
        types += ["bfloat16"] + (["int8_bfloat16"] if int8_available() else [])
    return types


@pytest.mark.slow
@pytest.mark.parametrize("compute_type", _compute_types())  # those this CPU runs
@pytest.mark.parametrize("draft", ["default", "self:2"])
def test_no_loaded_layer_of_any_compute_type_was_changed_after_construction(compute_type, draft):
    """Every decoder layer of real loaded pairs (the packaged base and its draft or a
    truncated self-draft, every compute type this CPU runs) is as its constructor made it:
    the forms live in the runner's steps, not on the layers."""
    from specasr.models.loading import load_pair

    pair = load_pair("base", draft=draft, device="cpu", compute_type=compute_type, half_weights=True)
    layers = _layers(pair)
    assert len(layers) >= 6 + 2
    assert {layer_name: unchanged_after_construction(layer) for layer_name, layer in enumerate(layers)} == {
        i: [] for i in range(len(layers))
    }
    int8 = compute_type.startswith("int8")
    assert pair.target_form.name == (SCRIPTED_INT8 if int8 else SCRIPTED_FP32)
    assert (pair.target_form.fixed_rows > 0) == int8  # an int8 target attends row-invariantly
    if draft == "default":  # the packaged int8 draft, quantised per call: no row invariance needed
        assert pair.draft_form.name == SCRIPTED_INT8 and pair.draft_form.fixed_rows == 0
    else:  # the target's first layers, in the target's forms
        assert pair.draft_form == pair.target_form


def test_choose_follows_the_weights_and_the_device():
    from tiny_pairs import random_tiny_pair

    from specasr.models.draft import DistilledDraft

    t = random_tiny_pair(seed=3).target
    assert choose(t.model.decoder.layers).name == EAGER  # the model's own layers: the reference
    assert LeanDecoder(t).form.name == SCRIPTED_FP32
    assert LeanDecoder(t, script=False).form.name == EAGER
    draft = DistilledDraft.from_target(t, (0,), torch.arange(t.config.vocab_size)).attach(t)
    assert draft.form.name == EAGER
    if int8_available():
        assert draft.quantize_int8(fused=False).form.name == SCRIPTED_INT8
        assert draft.form.fixed_rows == 0  # a draft needs no row invariance: it never decides a token


@pytest.mark.slow
def test_models_explain_says_which_form_runs_and_why():
    from specasr.cli import main

    out = CliRunner().invoke(main, ["models", "--explain", "--device", "cpu"])
    assert out.exit_code == 0, out.output
    assert "target base: compute type float32 on cpu" in out.output
    assert f"decoder layers: {SCRIPTED_FP32}" in out.output
    assert f"decoder layers: {SCRIPTED_INT8}" in out.output  # the packaged int8 draft
    assert "encoder: float32 products" in out.output
    if int8_available():
        out = CliRunner().invoke(main, ["models", "--explain", "--compute-type", "int8", "--draft", "none"])
        assert out.exit_code == 0, out.output
        assert "row-invariant attention from" in out.output and "draft" not in out.output
        from specasr.backends.cpu import fused

        on = fused.enabled() and fused.library() is not None
        encoder = "int8 products, a scale per frame" if on else "float32 products"
        assert f"encoder: {encoder}" in out.output


def test_no_init_scopes_overlapping_in_two_threads_leave_nn_init_its_own():
    """A loader's pool opens `no_init` in several threads (`quantize_target`'s layers fuse q, k
    and v under it). Scopes that overlap, the first to open leaving first, once left the second
    thread's saved no-ops in place as nn.init's own: every module built afterwards kept
    uninitialised weights (NaN in later products). They share one patch now."""
    import threading

    from torch import nn

    from specasr.runtime.layers import no_init

    own = nn.init.kaiming_uniform_
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    inside = []

    def first():
        with no_init():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with no_init():
            second_in.set()
            first_out.wait(5)
            inside.append(nn.init.kaiming_uniform_ is not own)  # still patched for this scope

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert inside == [True]
    assert nn.init.kaiming_uniform_ is own
    torch.manual_seed(0)
    assert torch.isfinite(nn.Linear(64, 96).weight).all() and nn.Linear(64, 96).weight.abs().sum() > 0


@pytest.mark.parametrize("compute_type", ["float32", "int8"])
def test_a_batch_of_windows_projects_its_cross_kv_row_by_row_with_each_rows_own_bits(compute_type):
    """`DecoderLayer.cross_kv` over B windows runs each projection on one window's [1, S, d]
    (a [B·S, d] product ran slower a row: out of cache) and gives each window the K, V (and
    Kᵀ) it gets alone, bitwise."""
    import copy

    from tiny_pairs import random_tiny_pair

    from specasr.models.whisper import quantize_window

    model = copy.deepcopy(random_tiny_pair(seed=5).target)
    if compute_type == "int8":
        if not int8_available():
            pytest.skip("this torch build has no fbgemm int8 linear")
        assert quantize_window(model)
    layer = model.model.decoder.layers[0]
    seen = []
    for proj in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj):
        proj.register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[0]))
    states = torch.randn(3, 1500, model.config.d_model, generator=torch.Generator().manual_seed(2))
    states[1] *= 40.0  # a loud window beside quiet ones
    with torch.inference_mode():
        for kt in (False, True):
            seen.clear()
            k, v = layer.cross_kv(states, kt)
            linear_kt = kt and type(layer.encoder_attn.k_proj) is torch.nn.Linear  # Kᵀ = W · statesᵀ
            assert seen == [1] * (3 if linear_kt else 6)  # one window per product (V, then K)
            assert k.shape[0] == v.shape[0] == 3 and k.is_contiguous() and v.is_contiguous()
            for b in range(3):
                ka, va = layer.cross_kv(states[b : b + 1], kt)
                assert torch.equal(k[b : b + 1], ka) and torch.equal(v[b : b + 1], va)
