"""The int8 target (`compute_type="int8"`): per-row int8 products that do not depend on the
rows beside them, a decoder that runs them (scripted and eager alike), how the compute type
is chosen, row-invariant attention (`specasr.backends.cpu.invariant`), which makes speculative
decoding of an int8 target exact, and the refusal where a machine's BLAS gives none."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from specasr.backends.cpu import bf16
from specasr.backends.cpu.linear import Int8Head, Int8Linear, int8_available
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

    from specasr.backends.cpu.linear import _QUANT_BLOCK, _quantize_rows

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

    from specasr.models.whisper import quantize_target
    from specasr.runtime.runner import LeanDecoder, LeanRunner

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
    auto = resolve_compute_type("auto", cpu, torch.float32)
    assert auto == ("float32" if not simd else "int8_bfloat16" if bf16.available() else "int8")
    assert resolve_compute_type("auto", cuda, torch.float16) == "float32"
    for device, dtype in ((cpu, torch.bfloat16), (cuda, torch.float16)):
        with pytest.raises(ValueError, match="int8 runs on a CPU in fp32"):
            resolve_compute_type("int8", device, dtype)
    with pytest.raises(ValueError, match="expected one of"):
        resolve_compute_type("int4", cpu, torch.float32)


def test_speculative_modes_refuse_an_int8_target_without_row_invariant_attention(tmp_path, monkeypatch):
    """Exactness is not given up quietly: where this machine's BLAS gives no row-invariant
    attention (`fixed_rows()` is 0; faked here), decoding refuses an int8 target in a
    speculative mode, and the CLI says so (exit 2) before any model loads."""
    from dataclasses import replace

    from tiny_pairs import random_tiny_pair

    import specasr.backends.cpu.invariant as invariant
    from specasr.cli import main
    from specasr.decode.loop import decode_states, speculates_exactly
    from specasr.options import DecodeOptions

    tiny = random_tiny_pair(seed=3)
    pair = replace(tiny, compute_type="int8")  # fp32 layers: fixed_rows 0, as a failed probe leaves them
    assert not speculates_exactly(pair) and speculates_exactly(tiny)
    states = torch.zeros(1, 1500, tiny.target.config.d_model)
    with pytest.raises(ValueError, match="decodes autoregressively only"):
        decode_states(pair, states, states, DecodeOptions(mode="exact"))
    monkeypatch.setattr(invariant, "fixed_rows", lambda: 0)
    wav = tmp_path / "x.wav"
    wav.write_bytes(b"")
    for args in (
        ["transcribe", str(wav), "--compute-type", "int8"],  # the default mode is exact
        ["eval", "librispeech-clean", "--data-dir", str(tmp_path), "--compute-type", "int8"],
    ):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and "decodes with --mode autoregressive only here" in result.output


def test_the_attention_probe_finds_a_row_count_here_and_fails_a_shape_dependent_kernel(monkeypatch):
    """`fixed_rows()`: this machine's BLAS computes attention rows alike from some row count
    on (4 with MKL on AVX2); a kernel whose rows depend on how many share the call fails the
    probe, so such a machine gets no int8 speculation rather than a silent mismatch."""
    import specasr.backends.cpu.invariant as invariant
    from specasr.backends.cpu.scripted import fixed_attend

    assert invariant.fixed_rows() in invariant.CANDIDATES
    g = torch.Generator().manual_seed(1)
    assert invariant._row_invariant(invariant.fixed_rows(), 1500, 0, g)

    def shape_dependent(q, K, V, mask, rows, chunk, kt=False):  # rows differ in the last bit with T
        y = fixed_attend(q, K, V, mask, rows, chunk, kt)
        return y * (1 + 1e-7 * q.shape[2])

    monkeypatch.setattr(invariant, "fixed_attend", shape_dependent)
    assert not invariant._row_invariant(4, 1500, 0, g)


def test_fixed_attention_is_row_invariant_and_close_to_plain_attention():
    """`fixed_attend` is attention (within fp32 rounding of SDPA), and in SELF_CHUNK key
    products a row's result does not depend on how many cache positions the pass reads."""
    import torch.nn.functional as F

    from specasr.backends.cpu.invariant import fixed_rows
    from specasr.backends.cpu.scripted import SELF_CHUNK, fixed_attend

    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 8, 6, 64, generator=g) * 0.125
    K, V = torch.randn(2, 2, 8, 448, 64, generator=g)
    pos = torch.tensor([[70, 71, 72, 73, 74, 75], [3, 4, 5, 6, 7, 8]])
    mask = (torch.arange(448) <= pos[:, :, None]).unsqueeze(1)  # [B, 1, T, 448]
    rows = fixed_rows()
    want = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=1.0)
    full = fixed_attend(q, K, V, mask, rows, SELF_CHUNK)
    assert torch.allclose(full, want, atol=1e-5)
    part = fixed_attend(q[1:], K[1:, :, :64], V[1:, :, :64], mask[1:, :, :, :64], rows, SELF_CHUNK)
    assert torch.equal(part, full[1:])  # row 1 reads one chunk instead of seven: the same bits
    one = fixed_attend(
        q[:1, :, 2:3], K[:1, :, :128], V[:1, :, :128], mask[:1, :, 2:3, :128], rows, SELF_CHUNK
    )
    assert torch.equal(one, full[:1, :, 2:3])
    # cross-attention reads Kᵀ [B, H, dh, S] (kt): the same attention, each row alike
    Kc, Vc = torch.randn(2, 2, 8, 1500, 64, generator=g)
    Kt = Kc.transpose(2, 3).contiguous()
    cross = fixed_attend(q, Kt, Vc, None, rows, 0, True)
    assert torch.allclose(cross, F.scaled_dot_product_attention(q, Kc, Vc, scale=1.0), atol=1e-5)
    assert torch.equal(fixed_attend(q[1:, :, 4:5], Kt[1:], Vc[1:], None, rows, 0, True), cross[1:, :, 4:5])


def test_an_int8_targets_runner_holds_k_transposed_and_a_draft_shares_it_as_k():
    """An int8 target's runner keeps each layer's cross K as Kᵀ [B, H, dh, S], contiguous
    (its attention's scores are then a plain product); a draft on the same states gets the
    K [B, H, S, dh] every other runner reads (`plain_cross`), equal to its own computation."""
    from tiny_pairs import random_tiny_pair

    from specasr.models.whisper import quantize_target
    from specasr.runtime.runner import LeanDecoder, LeanRunner

    model = quantize_target(copy.deepcopy(random_tiny_pair(seed=5).target))
    decoder = LeanDecoder(model)
    states = torch.randn(2, 1500, model.config.d_model, generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        runner = LeanRunner(decoder, states)
        plain = [layer.cross_kv(states) for layer in decoder.layers]
    assert runner.fixed
    for (kt, v), (k, v0), (pk, pv) in zip(runner.cross, plain, runner.plain_cross()):
        assert kt.is_contiguous() and kt.shape == (2, k.shape[1], k.shape[3], 1500)
        assert torch.equal(kt, k.transpose(2, 3)) and torch.equal(v, v0)
        assert torch.equal(pk, k) and torch.equal(pv, v0)
    with torch.inference_mode():  # given K [B, H, S, dh], a fixed runner stores it as Kᵀ
        again = LeanRunner(decoder, states, runner.plain_cross())
    assert all(torch.equal(a[0], b[0]) and a[0].is_contiguous() for a, b in zip(again.cross, runner.cross))


@pytest.mark.parametrize("bias", [False, True])
def test_k_transposed_is_one_product_equal_to_the_transposed_k(bias):
    """`cross_kv(kt=True)` multiplies W · statesᵀ for a plain Linear instead of transposing
    the product: the same K, laid out [B, H, dh, S] and contiguous, with a bias where a
    loaded module has one; a bf16 projection keeps its own product and the copy."""
    from specasr.runtime.layers import DecoderLayer

    g = torch.Generator().manual_seed(3)
    layer = DecoderLayer(64, 4, 128)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        if bias:
            layer.encoder_attn.k_proj = nn.Linear(64, 64)
            layer.encoder_attn.k_proj.weight.copy_(torch.randn(64, 64, generator=g) * 0.2)
            layer.encoder_attn.k_proj.bias.copy_(torch.randn(64, generator=g))
    states = torch.randn(3, 1500, 64, generator=g)
    for _ in range(2):  # a plain Linear, then its bf16 form
        with torch.inference_mode():
            (kt, v), (k, v0) = layer.cross_kv(states, kt=True), layer.cross_kv(states)
        assert kt.shape == (3, 4, 16, 1500) and kt.is_contiguous() and torch.equal(v, v0)
        torch.testing.assert_close(kt, k.transpose(2, 3), rtol=1e-5, atol=1e-5)
        bf16.bf16_cross_kv(SimpleNamespace(layers=[layer]))


@pytest.fixture(scope="module")
def int8_base():
    """The packaged base in int8 with its packaged draft (loaded once for this module)."""
    from specasr.models.loading import load_pair

    return load_pair("base", "default", compute_type="int8")


@pytest.fixture(scope="module")
def int8_ar(int8_base, librivox):
    """The int8 base's autoregressive result per LibriVox clip, keyed by clip id."""
    from specasr.options import DecodeOptions
    from specasr.transcription import transcribe_clip

    return {c.id: transcribe_clip(c.path, int8_base, DecodeOptions(mode="autoregressive")) for c in librivox}


@pytest.mark.slow
def test_an_int8_base_scores_every_row_of_a_verify_pass_as_its_one_token_step(int8_base):
    """Real weights: an int8 base's ragged batched passes of 1–8 tokens (and a 13-token first
    pass) give each row bitwise the logits that row gets alone, one token at a time. This
    is what makes speculative decoding of an int8 target exact."""
    import random

    from specasr.decode.runners import make_runner

    target = int8_base.target
    g = torch.Generator().manual_seed(0)
    states = torch.randn(3, 1500, 512, generator=g) * 0.5
    tokens = torch.randint(0, 50000, (3, 40), generator=g)
    alone = []
    for b in range(3):
        runner = make_runner(target, states[b : b + 1])
        rows = [runner(tokens[b : b + 1, :4], 4)[0]]
        rows += [runner(tokens[b : b + 1, t : t + 1], 1)[0] for t in range(4, 40)]
        alone.append(torch.cat(rows))  # [40, V]
    batch = make_runner(target, states)
    first = batch(tokens[:, :13], 13)
    assert all(torch.equal(first[b], alone[b][:13]) for b in range(3))
    rnd, checked = random.Random(1), 0
    while True:
        k, P = rnd.randint(1, 8), list(batch.lengths)
        if max(P) + k > 40:
            break
        logits = batch(torch.stack([tokens[b, P[b] : P[b] + k] for b in range(3)]), k)
        for b in range(3):
            assert torch.equal(logits[b], alone[b][P[b] : P[b] + k]), (P, k, b)
            checked += 1
        batch.rollback([P[b] + rnd.randint(1, k) for b in range(3)])  # rows accept different counts
    assert checked >= 15


@pytest.mark.slow
def test_an_int8_target_decodes_speculatively_with_its_own_greedy_tokens(int8_base, int8_ar, librivox):
    """Real weights: base in int8 with the packaged draft. Exact mode gives the int8 target's
    autoregressive tokens on every LibriVox clip and on the long-form fixture, sequential and
    chunked with VAD (ragged batched rows; with timestamps and without), with speculation running."""
    from benchmarks.longform import long_recording
    from specasr.backends.cpu.fused import Int8RowsLinear
    from specasr.options import DecodeOptions, TranscribeOptions, VadOptions
    from specasr.transcription import transcribe, transcribe_clip

    pair = int8_base
    assert pair.compute_type == "int8" and pair.draft is not None
    assert any(isinstance(m, Int8RowsLinear) for m in pair.target.model.encoder.modules())  # int8 states
    assert all(
        isinstance(layer.encoder_attn.v_proj, Int8RowsLinear) for layer in pair.target.model.decoder.layers
    )
    for clip in librivox:
        ex = transcribe_clip(clip.path, pair, DecodeOptions(mode="exact"))
        assert ex.tokens == int8_ar[clip.id].tokens, clip.id
    rec = long_recording(librivox[0].path.parent)
    chunked_vad = TranscribeOptions(strategy="chunked", batch_size=8, vad=VadOptions())
    for opts in (TranscribeOptions(), chunked_vad, chunked_vad.with_decode(timestamps=False)):
        runs = {}
        for mode in ("autoregressive", "exact"):
            segments, info = transcribe(rec.samples, pair, opts.with_decode(mode=mode), source_rate=16000)
            runs[mode] = ([s.tokens for s in segments], info.stats)
        assert runs["exact"][0] == runs["autoregressive"][0], opts.strategy
        assert runs["exact"][1].proposed > 0 and runs["exact"][1].token_acceptance > 0.5


@pytest.mark.slow
def test_base_in_int8_transcribes_the_clips_as_fp32_does(int8_base, int8_ar, base_pair, base_ar, librivox):
    """Real weights: an int8 base is a different model, but on the LibriVox clips its
    transcripts stay within a point of fp32's WER, and it reports its compute type."""
    from specasr.eval.metric import wer

    assert base_pair.compute_type == "float32" and int8_base.compute_type == "int8"
    texts = {
        "float32": [base_ar[c.id].text for c in librivox],
        "int8": [int8_ar[c.id].text for c in librivox],
    }
    refs = [c.text for c in librivox]
    assert wer(refs, texts["int8"]) <= wer(refs, texts["float32"]) + 0.01
    assert sum(a == b for a, b in zip(texts["int8"], texts["float32"])) >= len(librivox) - 1


@pytest.mark.parametrize("int8", [True, False])
def test_a_prompts_rows_skip_the_last_layer_but_keep_their_keys_and_values(monkeypatch, int8):
    """A window's first pass over a prompt scores only its last rows: the last layer computes
    the others' keys and values and nothing else (`LeanRunner`, `SKIP_ROWS`). The scored
    logits and every cached key and value, and the next pass's logits, are those of the whole
    pass: bitwise for an int8 target (per-row products), to float rounding in fp32."""
    from tiny_pairs import random_tiny_pair

    import specasr.runtime.runner as lean
    from specasr.models.whisper import quantize_target
    from specasr.runtime.runner import LeanDecoder, LeanRunner

    model = random_tiny_pair(seed=5).target
    model = quantize_target(copy.deepcopy(model)) if int8 else model
    decoder = LeanDecoder(model)
    g = torch.Generator().manual_seed(6)
    states = torch.randn(1, 1500, model.config.d_model, generator=g)
    prompt, step = torch.randint(0, 50000, (1, 30), generator=g), torch.randint(0, 50000, (1, 3), generator=g)
    seen = []
    *early, last = decoder.steps  # the last layer's step, watched
    monkeypatch.setattr(decoder, "steps", (*early, lambda x, *a: seen.append(x.shape[1]) or last(x, *a)))
    out = {}
    for skip in (lean.SKIP_ROWS, 10**9):
        monkeypatch.setattr(lean, "SKIP_ROWS", skip)
        runner = LeanRunner(decoder, states)
        with torch.inference_mode():
            first, nxt = runner(prompt, 4), runner(step, 3)
        out[skip] = (first, nxt, [t[:, :, :33] for t in runner.k + runner.v])
    assert seen == [4, 3, 30, 3]  # the skipping pass's last layer saw only the scored rows
    same = torch.equal if int8 else (lambda a, b: torch.allclose(a, b, atol=1e-5, rtol=1e-4))
    (f1, n1, c1), (f2, n2, c2) = out[lean.SKIP_ROWS], out[10**9]
    assert same(f1, f2) and same(n1, n2) and all(same(a, b) for a, b in zip(c1, c2))


def test_an_int8_encoder_quantises_each_frame_on_its_own_and_stays_close_to_fp32():
    """`quantize_encoder`: every encoder product becomes a per-row int8 product (the compiled
    library's), a frame's states do not depend on the other frames' scale beyond what attention
    mixes, and the states stay close to the fp32 encoder's."""
    from tiny_pairs import random_tiny_pair

    from specasr.backends.cpu.fused import Int8RowsLinear
    from specasr.models.whisper import quantize_encoder

    plain = random_tiny_pair(seed=5).target
    q8 = copy.deepcopy(plain)
    assert quantize_encoder(q8.model.encoder)
    linears = [m for m in q8.model.encoder.modules() if isinstance(m, (nn.Linear, Int8RowsLinear))]
    assert linears and all(isinstance(m, Int8RowsLinear) for m in linears)
    x = torch.randn(5, plain.config.d_model) * torch.tensor([[1e-3], [1.0], [10.0], [1e3], [0.5]])
    form = linears[0]
    alone = torch.cat([form(x[i : i + 1]) for i in range(5)])
    assert torch.equal(form(x), alone)  # each frame on its own grid: 1e3 beside 1e-3 changes nothing
    mel = torch.randn(2, plain.config.num_mel_bins, 3000, generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        ref, mine = plain.model.encoder(mel), q8.model.encoder(mel)
    assert ((mine - ref).norm() / ref.norm()) < 0.1


def test_an_int8_targets_cross_keys_and_values_are_per_frame_int8_and_each_windows_own():
    """`quantize_window`: the encoder's products and every layer's cross K/V projections become
    the library's per-row products; a window's K/V (and Kᵀ) in a batch of windows are bitwise
    those it gets alone, and close to fp32's."""
    from tiny_pairs import random_tiny_pair

    from specasr.backends.cpu.fused import Int8RowsLinear
    from specasr.models.whisper import quantize_window

    plain = random_tiny_pair(seed=5).target
    q8 = copy.deepcopy(plain)
    assert quantize_window(q8)
    layers = q8.model.decoder.layers
    assert all(
        isinstance(getattr(x.encoder_attn, n), Int8RowsLinear) for x in layers for n in ("k_proj", "v_proj")
    )
    assert all(
        isinstance(m, Int8RowsLinear) for m in q8.model.encoder.modules() if hasattr(m, "out_features")
    )
    g = torch.Generator().manual_seed(8)
    states = torch.randn(2, 1500, plain.config.d_model, generator=g) * torch.tensor([[[0.1]], [[30.0]]])
    with torch.inference_mode():
        for kt in (False, True):
            for mine, ref in zip(layers, plain.model.decoder.layers):
                both = mine.cross_kv(states, kt)  # K (or Kᵀ), V [2, H, …]
                alone = [mine.cross_kv(states[i : i + 1], kt) for i in range(2)]
                for j in range(2):
                    assert all(torch.equal(both[t][j], alone[j][t][0]) for t in range(2))
                for a, b in zip(both, ref.cross_kv(states, kt)):
                    assert ((a - b).norm() / b.norm()) < 0.05


def test_only_compute_type_int8_quantises_the_encoder():
    from specasr.constants import int8_window

    assert int8_window("int8") and not any(int8_window(c) for c in ("float32", "bfloat16", "int8_bfloat16"))


def test_an_int8_encoder_stays_fp32_where_the_library_is_off(monkeypatch):
    from tiny_pairs import random_tiny_pair

    from specasr.models.whisper import quantize_encoder, quantize_window

    monkeypatch.setenv("SPECASR_FUSED_DRAFT", "0")
    model = random_tiny_pair(seed=5).target
    assert not quantize_encoder(model.model.encoder) and not quantize_window(model)
    assert all(type(m) is nn.Linear for m in model.model.encoder.modules() if isinstance(m, nn.Linear))
    assert all(type(x.encoder_attn.k_proj) is nn.Linear for x in model.model.decoder.layers)
