"""Draft distillation: the synthetic corpus, and the recipe end to end on the real target."""

from __future__ import annotations

import json
import shutil
from importlib.resources import files

import numpy as np
import pytest
import soundfile as sf
import torch
from specasr.recipes import tts_corpus
from specasr.recipes.distill_draft import DistillOptions, choose_vocabulary, distill

EXAMPLE = files("specasr") / "assets" / "example.wav"


def test_fortune_cleaning_and_held_out_exclusion(tmp_path):
    (tmp_path / "quotes").write_text(
        "A stitch in time saves nine, said the tailor to the king.\n%\n"
        "<html> is not speech </html>\n%\n"
        "Too short.\n%\n"
        "  Whitespace   spread over\n  several lines is joined into one sentence\n%\n"
        "The wandering knight rode slowly across the river at dawn today.\n"
    )
    (tmp_path / "quotes.dat").write_bytes(b"\x00\x01")  # strfile index: not text, skipped
    kept = tts_corpus.load_texts([], root=tmp_path)
    assert "Whitespace spread over several lines is joined into one sentence" in kept
    assert not any("<html>" in t or t == "Too short." for t in kept)
    held_out = ["the wandering knight rode slowly across the plains"]  # shares a 5-word run
    kept2 = tts_corpus.load_texts(held_out, root=tmp_path)
    assert len(kept2) == len(kept) - 1
    assert not any("wandering knight" in t for t in kept2)


@pytest.mark.slow  # runs espeak-ng and flite
def test_corpus_windows_are_speech_within_30_s_and_resumable(tmp_path):
    opts = tts_corpus.CorpusOptions(windows=3, seed=7, workers=1, festival_share=0.0, flite_share=0.5)
    assert tts_corpus.missing_tools(opts) == [], "CI installs espeak-ng, flite and fortunes (.ci/run)"
    tts_corpus.make_corpus(tmp_path, opts)
    records = [json.loads(x) for x in (tmp_path / "corpus.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["w000000", "w000001", "w000002"]
    for r in records:
        audio, rate = sf.read(tmp_path / f"{r['id']}.wav", dtype="float32")
        assert rate == 16000 and 1.0 < len(audio) / rate <= 30.0
        assert np.abs(audio).max() > 0.05 and r["texts"] and len(r["voices"]) == len(r["texts"])
    stamp = (tmp_path / "w000000.wav").stat().st_mtime_ns
    tts_corpus.make_corpus(tmp_path, opts)  # everything present: nothing redone
    assert len((tmp_path / "corpus.jsonl").read_text().splitlines()) == 3
    assert (tmp_path / "w000000.wav").stat().st_mtime_ns == stamp


def test_vocabulary_keeps_eot_timestamps_and_frequent_tokens(base_pair):
    tok = base_pair.tokenizer
    labels = [[440, 440, 440, 9999, 50364, 50400], [9999, 30000]]
    ids = choose_vocabulary(base_pair, labels, 2048).tolist()
    assert len(ids) == 2048 and ids == sorted(ids)
    assert {tok.eot, 440, 9999, 30000} <= set(ids)
    assert set(range(tok.timestamp_begin, base_pair.vocab_size)) <= set(ids)
    assert not set(base_pair.suppress_tokens) & set(ids)
    # continuing from a draft: its vocabulary fills what the labels leave, before the lowest ids
    prefer = torch.tensor([40000, 30001, base_pair.suppress_tokens[-1]])
    kept = set(choose_vocabulary(base_pair, labels, 2048, prefer).tolist())
    assert {40000, 30001} <= kept and base_pair.suppress_tokens[-1] not in kept
    assert not {40000, 30001} & set(ids) and len(kept) == 2048


@pytest.mark.slow
def test_distill_end_to_end_resumes_and_yields_an_exact_draft(base_pair, tmp_path):
    """Two windows, two training steps: the mechanics (labels, teacher, training, file,
    resume, loading, exactness), not the quality of the draft."""
    from dataclasses import replace

    from specasr.models.loading import load_draft
    from specasr.options import DecodeOptions
    from specasr.transcription import transcribe_clip

    audio_dir = tmp_path / "audio"
    audio_dir.mkdir()
    shutil.copy(EXAMPLE, audio_dir / "a.wav")
    x, _ = sf.read(EXAMPLE, dtype="float32")
    sf.write(audio_dir / "b.flac", x[::-1].copy() * 0.5 + x * 0.5, 16000)  # a second, different window
    (audio_dir / "broken.wav").write_bytes(b"RIFF not really")
    opts = DistillOptions(epochs=1, batch_size=1, holdout=0.5, label_batch=2, vocab=2048, checkpoint_every=1)
    out, work = tmp_path / "d.safetensors", tmp_path / "work"
    logs = []
    summary = distill(base_pair, audio_dir, out, work, opts, log=logs.append)
    assert summary["windows"] == 2 and summary["vocab"] == 2048
    assert [h["step"] for h in summary["history"]] == [0, 1]
    shard = work / "labels" / "00000.pt"
    stamp = shard.stat().st_mtime_ns
    assert 0 < out.stat().st_size < 25e6
    distill(base_pair, audio_dir, out, work, opts, log=logs.append)  # resumes: nothing relabelled
    assert shard.stat().st_mtime_ns == stamp
    assert any("resumed from step 1" in line for line in logs)
    # labels belong to the target that made them: another compute type needs its own work dir
    with pytest.raises(RuntimeError, match="from a float32 target, not int8"):
        distill(replace(base_pair, compute_type="int8"), audio_dir, out, work, opts, log=logs.append)

    draft = load_draft(out, base_pair.target, torch.float32, torch.device("cpu"))
    assert json.loads(draft.meta["recipe"])["compute_type"] == "float32"
    pair = replace(base_pair, draft=draft, shared_encoder=True, draft_name=str(out))
    opts = DecodeOptions(mode="exact")
    ar = transcribe_clip(str(EXAMPLE), pair, replace(opts, mode="autoregressive"))
    sp = transcribe_clip(str(EXAMPLE), pair, opts)
    assert sp.tokens == ar.tokens and sp.stats.proposed > 0


@pytest.mark.slow
def test_distill_labels_each_window_in_its_corpus_language_and_can_start_from_a_draft(base_pair, tmp_path):
    """A corpus.jsonl naming languages sets each window's label language (the labels are
    transcripts in it, not translations to English); --init starts from a trained draft's
    layers over this run's vocabulary, and the file records the languages it trained on."""
    from dataclasses import replace

    from safetensors.torch import load_file

    from specasr.models.loading import load_draft, packaged_draft

    audio_dir = tmp_path / "audio"
    (audio_dir / "src").mkdir(parents=True)
    shutil.copy(EXAMPLE, audio_dir / "src" / "a.wav")
    shutil.copy(EXAMPLE, audio_dir / "src" / "b.wav")
    (audio_dir / "corpus.jsonl").write_text(
        json.dumps({"id": "a", "path": "src/a.wav", "language": "fr"})
        + "\n"
        + json.dumps({"id": "b", "path": "src/b.wav", "language": "en"})
        + "\n"
    )
    opts = DistillOptions(
        epochs=1, batch_size=2, holdout=0.5, label_batch=2, vocab=2048, lr=0.0, init="packaged:base"
    )
    out, work = tmp_path / "d.safetensors", tmp_path / "work"
    summary = distill(base_pair, audio_dir, out, work, opts, log=lambda _: None)
    record = torch.load(work / "labels" / "00000.pt")
    assert record["languages"] == ["fr", "en"]
    assert record["tokens"][0] != record["tokens"][1]  # same audio, labelled in two languages
    assert set(summary["coverage_by_language"]) == {"fr", "en"}
    draft = load_draft(out, base_pair.target, torch.float32, torch.device("cpu"))
    assert draft.languages == ("en", "fr") and len(draft.vocab_ids) == 2048
    mine, shipped = load_file(str(out)), load_file(str(packaged_draft("base")))
    layer_keys = [k for k in shipped if k != "vocab_ids"]
    assert layer_keys and all(torch.equal(mine[k], shipped[k]) for k in layer_keys)  # lr 0: the init, kept
    pooled = tmp_path / "pooled.safetensors"  # the cached labels and teacher; pooled frames
    distill(base_pair, audio_dir, pooled, work, replace(opts, cross_pool=3), log=lambda _: None)
    assert load_draft(pooled, base_pair.target, torch.float32, torch.device("cpu")).cross_pool == 3
    with pytest.raises(ValueError, match="1500 frames"):
        replace(opts, cross_pool=7)
    with pytest.raises(FileNotFoundError, match="not a specasr draft"):
        distill(
            base_pair, audio_dir, out, tmp_path / "w2", replace(opts, init=str(EXAMPLE)), log=lambda _: None
        )


def test_averaging_two_drafts_mixes_their_tensors_and_keeps_the_base_vocabulary(tmp_path):
    """`specasr distill average`: (1 - w) · base + w · other per tensor, base's vocabulary and
    metadata; the pooling must be said when the two differ; mismatched drafts are refused."""
    from click.testing import CliRunner
    from specasr.recipes.distill_draft import average_drafts
    from tiny_pairs import random_tiny_pair

    from specasr.cli import main
    from specasr.models.draft import DistilledDraft, load_draft

    t = random_tiny_pair(seed=3).target
    a = DistilledDraft.from_target(t, (0, 1), torch.arange(0, 51865, 5))
    b = DistilledDraft.from_target(t, (1, 0), torch.arange(1, 51865, 5))
    b.cross_pool = 2
    a.save(tmp_path / "a.safetensors", target="random")
    b.save(tmp_path / "b.safetensors", target="other")
    out = tmp_path / "avg.safetensors"
    meta = average_drafts(str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), 0.25, out, 2)
    assert meta["target"] == "random" and meta["cross_pool"] == "2"
    assert json.loads(meta["average"])["weight"] == 0.25
    avg = load_draft(out, t, torch.float32, torch.device("cpu"))
    assert avg.cross_pool == 2 and torch.equal(avg.vocab_ids, a.vocab_ids)
    mixed = (0.75 * a.layers[0].fc1.weight + 0.25 * b.layers[0].fc1.weight).half().float()
    torch.testing.assert_close(avg.layers[0].fc1.weight, mixed, rtol=2e-3, atol=1e-4)
    assert not torch.equal(avg.layers[0].fc1.weight, a.layers[0].fc1.weight.half().float())
    with pytest.raises(ValueError, match="say which"):
        average_drafts(str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), 0.5, out)
    with pytest.raises(ValueError, match="not in"):
        average_drafts(str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), 1.5, out, 1)
    with pytest.raises(ValueError, match="1500 frames"):  # a pooling no draft could run
        average_drafts(str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), 0.5, out, 7)
    DistilledDraft.from_target(t, (0,), torch.arange(0, 51865, 5)).save(tmp_path / "one.safetensors")
    bad = CliRunner().invoke(
        main,
        [
            "distill",
            "average",
            str(tmp_path / "a.safetensors"),
            str(tmp_path / "one.safetensors"),
            "--weight",
            "0.5",
            "--out",
            str(tmp_path / "x.safetensors"),
        ],
    )
    assert bad.exit_code == 1 and "same tensors" in bad.output
    assert not (tmp_path / "x.safetensors").exists()


def test_distill_train_labels_with_the_compute_type_asked_for(monkeypatch, tmp_path):
    """`specasr distill train --compute-type` loads the target in that form for labels and
    teacher (the recipe itself is stubbed: the end-to-end test above runs it)."""
    import specasr.recipes.distill_draft as recipe
    from click.testing import CliRunner

    import specasr.cli.distill as cli_distill
    from specasr.cli import main

    seen = {}

    def load(model, draft, mode, device, dtype, compute_type="float32", half_weights=None):
        seen["load"] = (model, draft, mode, compute_type)
        return "pair"

    def run(pair, audio_dir, out, work, opts, log=print, stop_after="train"):
        seen["run"] = (pair, stop_after)
        return {"shards": 0}

    monkeypatch.setattr(cli_distill, "load_models", load)
    monkeypatch.setattr(recipe, "distill", run)
    args = ["distill", "train", str(tmp_path), "--out", str(tmp_path / "d.safetensors")]
    args += ["--work", str(tmp_path / "w"), "--stop-after", "label"]
    for extra, want in (([], "float32"), (["--compute-type", "int8_bfloat16"], "int8_bfloat16")):
        result = CliRunner().invoke(main, args + extra)
        assert result.exit_code == 0, result.output
        assert seen["load"] == ("base", "none", "autoregressive", want)
        assert seen["run"] == ("pair", "label")
    bad = CliRunner().invoke(main, args + ["--compute-type", "int4"])
    assert bad.exit_code == 2 and "int4" in bad.output
