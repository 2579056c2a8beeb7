"""`specasr distill export --hf`: a distilled draft as transformers' assistant model (issue 21)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from specasr.cli import main
from specasr.models.hf_export import OFF_VOCAB, export_hf, off_vocab_row


def test_off_vocab_row_scores_one_constant_for_any_input():
    torch.manual_seed(0)
    d = 64
    ln = torch.nn.LayerNorm(d)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 3.0)
        ln.bias.normal_(0.0, 1.0)
    row = off_vocab_row(ln.weight, ln.bias, score=-1234.0)
    assert row is not None
    h = torch.randn(100, d) * torch.linspace(0.1, 50.0, 100)[:, None] + 7.0  # any scale and offset
    scores = ln(h) @ row
    assert torch.allclose(scores, torch.full_like(scores, -1234.0), atol=0.5), scores
    # a plain embedding row scores differently per input: the construction is what makes it constant
    assert (ln(h) @ torch.randn(d)).std() > 1.0


def test_off_vocab_row_refuses_what_a_layernorm_cannot_express():
    gain = torch.ones(8)
    assert off_vocab_row(gain, torch.zeros(8)) is None  # sum(b / g) = 0
    gain[3] = 0.0
    assert off_vocab_row(gain, torch.ones(8)) is None  # a zero gain


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from specasr.models.loading import packaged_draft

    out = tmp_path_factory.mktemp("hf") / "draft"
    return export_hf(packaged_draft("base"), None, out)


@pytest.fixture(scope="module")
def hf_pair(exported):
    from transformers import WhisperForCausalLM, WhisperForConditionalGeneration

    from specasr.models.convert import cached_conversion
    from specasr.models.loading import offline_files

    target = WhisperForConditionalGeneration.from_pretrained(cached_conversion(offline_files("base"))).eval()
    assistant, info = WhisperForCausalLM.from_pretrained(exported.out, output_loading_info=True)
    assert not any(info.values()), info  # every tensor in the file, nothing missing or unexpected
    return target, assistant.eval()


@pytest.mark.slow
def test_export_gives_the_drafts_logits_and_masks_the_rest(
    exported, hf_pair, base_pair, librivox, librivox_mels
):
    from specasr.models.draft import load_draft
    from specasr.models.loading import packaged_draft

    assert exported.masked and exported.vocab == 16384 and exported.layers == 2
    cfg = json.loads((exported.out / "config.json").read_text())
    assert cfg["architectures"] == ["WhisperForCausalLM"] and cfg["tie_word_embeddings"] is False
    target, assistant = hf_pair
    draft = load_draft(packaged_draft("base"), base_pair.target, torch.float32, torch.device("cpu"))
    assert exported.cross_pool == draft.cross_pool == cfg["specasr_draft"]["cross_pool"]
    draft.cross_pool = 1  # the export attends over every frame (transformers has no pooled form)
    mel = next(iter(librivox_mels.values()))  # [1, 80, 3000]
    prompt = torch.tensor(
        [[base_pair.tokenizer.sot, *base_pair.tokenizer.encode(" And Mr. John Dashwood had")]]
    )
    with torch.inference_mode():
        states = target.model.encoder(mel).last_hidden_state  # [1, 1500, 512]
        hf = assistant(input_ids=prompt, encoder_outputs=(states,)).logits  # [1, T, V]
        ours = draft.full_logits(draft(prompt, draft.cross_kv(states)))  # [1, T, V], −inf off-vocabulary
    inside = torch.isfinite(ours)
    assert inside.sum(-1).eq(16384).all()
    assert torch.allclose(hf[inside], ours[inside], atol=1e-4, rtol=1e-4)
    off = hf[~inside]
    assert off.max() < -OFF_VOCAB + 1 and off.min() > -OFF_VOCAB - 1
    assert torch.equal(hf.argmax(-1), ours.argmax(-1))


@pytest.mark.slow
def test_hf_assisted_generation_with_the_export_gives_greedy_tokens(hf_pair, librivox, librivox_mels):
    target, assistant = hf_pair
    kw = {"language": "en", "task": "transcribe", "do_sample": False}
    for clip in librivox[:2]:
        mel = librivox_mels[clip.id]
        with torch.inference_mode():
            greedy = target.generate(input_features=mel, **kw)
            assisted = target.generate(input_features=mel, assistant_model=assistant, **kw)
        assert greedy.shape[1] > 8, clip.id
        assert assisted.tolist() == greedy.tolist(), clip.id


@pytest.mark.slow
def test_cli_export_writes_once_and_reports_errors(tmp_path):
    out = tmp_path / "hf"
    ok = CliRunner().invoke(main, ["distill", "export", "packaged:base", "--hf", str(out)])
    assert ok.exit_code == 0, ok.output
    assert "16384 tokens" in ok.output and (out / "model.safetensors").is_file()
    pooled = json.loads((out / "config.json").read_text())["specasr_draft"]["cross_pool"] > 1
    assert ("attends over every frame" in ok.output) == pooled, ok.output  # it says what it dropped
    assert not list(tmp_path.glob(".hf.tmp-*"))  # the temporary directory was renamed into place
    again = CliRunner().invoke(main, ["distill", "export", "packaged:base", "--hf", str(out)])
    assert again.exit_code == 1 and "not empty" in again.output
    missing = tmp_path / "nope.safetensors"
    bad = CliRunner().invoke(main, ["distill", "export", str(missing), "--hf", str(tmp_path / "x")])
    assert bad.exit_code == 1 and "not a distilled draft" in bad.output
    assert not (tmp_path / "x").exists()
