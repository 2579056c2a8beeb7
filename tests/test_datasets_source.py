"""`specasr eval datasets`: Hugging Face datasets saved with save_to_disk, as parquet files,
with audio as arrays, bytes or paths, read without datasets' own audio decoding."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner
from datasets import Audio, Dataset, DatasetDict
from specasr.recipes import DATASETS, DatasetError

from specasr.cli import main
from specasr.eval.runner import RESULTS, read_results

load = DATASETS["datasets"].load


def _samples(clip) -> np.ndarray:
    return sf.read(clip.path, dtype="float32")[0]


def _arrays(clips, ids=True) -> Dataset:
    """Audio as {array, sampling_rate} structs (no Audio feature: casting one would encode)."""
    columns = {
        "audio": [{"array": _samples(c), "sampling_rate": 16000} for c in clips],
        "text": [c.text for c in clips],
    }
    return Dataset.from_dict(columns | ({"id": [c.id for c in clips]} if ids else {}))


def _bytes(clips, text="text") -> Dataset:
    """An Audio column of encoded wav bytes, as the hub's parquet files hold them."""
    columns = {
        "audio": [{"bytes": c.path.read_bytes(), "path": None} for c in clips],
        text: [c.text for c in clips],
    }
    return Dataset.from_dict(columns).cast_column("audio", Audio(decode=False))


def test_arrays_bytes_and_paths_load_the_same_samples(librivox, tmp_path):
    clips = librivox[:2]
    _arrays(clips).save_to_disk(str(tmp_path / "disk"))
    (tmp_path / "pq").mkdir()
    _bytes(clips).to_parquet(str(tmp_path / "pq" / "test-00000-of-00001.parquet"))
    by_array = load(tmp_path / "disk")
    assert [u.id for u in by_array] == sorted(c.id for c in clips)  # the id column
    expected = {c.id: _samples(c) for c in clips}
    for u in by_array:
        assert isinstance(u.audio, tuple) and u.text == next(c.text for c in clips if c.id == u.id)
        np.testing.assert_array_equal(u.load(), expected[u.id])
    for source in (tmp_path / "pq", tmp_path / "pq" / "test-00000-of-00001.parquet"):
        by_bytes = load(source)
        assert [u.id for u in by_bytes] == ["000000", "000001"]  # no id column: row numbers
        for u, clip in zip(by_bytes, clips):
            assert isinstance(u.audio, bytes) and u.text == clip.text
            np.testing.assert_array_equal(u.load(), _samples(clip))
    # a column of paths: absolute, or relative to the dataset's directory
    files = {"file": [str(clips[0].path), clips[1].path.name], "sentence": [c.text for c in clips]}
    Dataset.from_dict(files).save_to_disk(str(tmp_path / "paths"))
    shutil.copy(clips[1].path, tmp_path / "paths")
    by_path = load(tmp_path / "paths", audio_column="file", text_column="sentence")
    assert [u.audio for u in by_path] == [str(clips[0].path), str(tmp_path / "paths" / clips[1].path.name)]
    for u, clip in zip(by_path, clips):
        np.testing.assert_array_equal(u.load(), _samples(clip))


def test_splits_columns_and_bad_sources(librivox, tmp_path):
    DatasetDict({"train": _arrays(librivox[:1]), "test": _arrays(librivox[1:3])}).save_to_disk(
        str(tmp_path / "d")
    )
    assert len(load(tmp_path / "d")) == 2  # "test" by default
    assert [u.id for u in load(tmp_path / "d", split="train")] == [librivox[0].id]
    with pytest.raises(DatasetError, match="no split 'dev'; it has test, train"):
        load(tmp_path / "d", split="dev")
    with pytest.raises(DatasetError, match="no column transcript; it has audio, text, id"):
        load(tmp_path / "d", text_column="transcript")
    _arrays(librivox[:1]).save_to_disk(str(tmp_path / "one"))
    assert len(load(tmp_path / "one", split="validation")) == 1  # a Dataset has no splits to choose
    with pytest.raises(DatasetError, match="neither a save_to_disk dataset nor parquet"):
        load(tmp_path)
    bad = Dataset.from_dict({"audio": [12], "text": ["x"]})
    bad.save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(DatasetError, match="row 0: the audio is int"):
        load(tmp_path / "bad")
    twice = Dataset.from_dict({"audio": ["a.wav", "b.wav"], "text": ["x", "y"], "id": ["u", "u"]})
    twice.save_to_disk(str(tmp_path / "twice"))
    with pytest.raises(DatasetError, match="id 'u' is there twice"):
        load(tmp_path / "twice")


def test_cli_refuses_a_bad_dataset_and_misplaced_options(librivox, tmp_path):
    _arrays(librivox[:1]).save_to_disk(str(tmp_path / "d"))
    run = CliRunner().invoke
    result = run(main, ["eval", "datasets", "--data-dir", str(tmp_path / "d"), "--text-column", "nope"])
    assert result.exit_code == 2 and "no column nope" in result.output
    result = run(main, ["eval", "manifest", "--data-dir", str(tmp_path / "m.jsonl"), "--split", "test"])
    assert result.exit_code == 2 and "go with the datasets source" in result.output


@pytest.mark.slow
def test_save_to_disk_and_parquet_evaluate_like_a_manifest(librivox, tmp_path):
    """The same two clips as a manifest of wav files, a save_to_disk dataset of arrays and a
    parquet file of wav bytes: the same hypotheses and WER (tiny.en, greedy)."""
    clips = librivox[:2]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "".join(json.dumps({"id": c.id, "audio": str(c.path), "text": c.text}) + "\n" for c in clips)
    )
    _arrays(clips).save_to_disk(str(tmp_path / "disk"))
    parquet = _bytes(clips).add_column("id", [c.id for c in clips])
    parquet.to_parquet(str(tmp_path / "clips.parquet"))
    runs = {}
    for name, source in (
        ("manifest", manifest),
        ("datasets", tmp_path / "disk"),
        ("datasets", tmp_path / "clips.parquet"),
    ):
        out = tmp_path / f"out-{source.name}"
        args = ["eval", name, "--data-dir", str(source), "--model", "tiny.en", "--modes", "autoregressive"]
        result = CliRunner().invoke(main, [*args, "-o", str(out)])
        assert result.exit_code == 0, result.output
        summary = json.loads((out / "summary.json").read_text())["modes"]["autoregressive"]
        hyps = {r["id"]: r["hypothesis"] for r in read_results(out / RESULTS)}
        runs[source.name] = (summary["wer"], summary["utterances"], summary["words"], hyps)
    assert runs["disk"] == runs["m.jsonl"] == runs["clips.parquet"]
    wer, utterances, words, hyps = runs["disk"]
    assert utterances == 2 and words == sum(len(c.text.split()) for c in clips) and wer <= 0.15
    assert sorted(hyps) == sorted(c.id for c in clips) and all(hyps.values())
