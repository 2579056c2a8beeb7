"""`--ray` on a local Ray with 2 CPUs: the local run's hypotheses and WER, a corrupt file
recorded while the rest complete, and an interrupted run resumed without duplicates."""

from __future__ import annotations

import json
import logging
import pickle
import shutil
import sys

import pytest
from click.testing import CliRunner
from test_recipes import make_librispeech

from specasr.cli import main
from specasr.eval import ray_runner
from specasr.eval.runner import RESULTS, read_results

ARGS = ["--model", "tiny.en", "--modes", "autoregressive"]


def _eval(*args: str):
    return CliRunner().invoke(main, ["eval", "librispeech-clean", *args])


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module (2 CPUs, no dashboard); `--ray` joins it."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def mini(librivox, tmp_path_factory):
    """Two LibriVox clips in the LibriSpeech layout, and a corrupt third file."""
    root = tmp_path_factory.mktemp("librispeech")
    make_librispeech(root, librivox[:2])
    chapter = root / "LibriSpeech" / "test-clean" / "1000" / "2000"
    (chapter / "1000-2000-0009.flac").write_bytes(b"fLaC not really")
    with open(chapter / "1000-2000.trans.txt", "a") as f:
        f.write("1000-2000-0009 A BROKEN FILE\n")
    return root


@pytest.fixture(scope="module")
def local_run(mini, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    result = _eval("--data-dir", str(mini), *ARGS, "-o", str(out))
    assert result.exit_code == 1 and "1 decode(s) failed" in result.stderr, result.output
    return out


def _by_id(out) -> dict[str, dict]:
    return {r["id"]: r for r in read_results(out / RESULTS)}


def _summary(out) -> dict:
    return json.loads((out / "summary.json").read_text())["modes"]["autoregressive"]


@pytest.mark.slow
def test_ray_eval_gives_the_local_runs_hypotheses_and_wer(local_ray, mini, local_run, tmp_path):
    out = tmp_path / "ray"
    result = _eval("--data-dir", str(mini), *ARGS, "--ray", "--workers", "2", "-o", str(out))
    assert result.exit_code == 1, result.output  # the corrupt file
    assert "1 decode(s) failed" in result.stderr and "on Ray (2 worker(s))" in result.stderr
    ray_recs, local_recs = _by_id(out), _by_id(local_run)
    assert len(read_results(out / RESULTS)) == 3 and ray_recs.keys() == local_recs.keys()
    bad = ray_recs.pop("1000-2000-0009")
    assert bad["hypothesis"] is None and "1000-2000-0009.flac" in bad["error"]
    assert all(r["error"] is None for r in ray_recs.values())
    assert {k: r["hypothesis"] for k, r in ray_recs.items()} == {
        k: local_recs[k]["hypothesis"] for k in ray_recs
    }
    assert len({r["hypothesis"] for r in ray_recs.values()}) == 2  # not one text for every row
    a, b = _summary(out), _summary(local_run)
    assert (a["wer"], a["utterances"], a["words"], a["failed"]) == (b["wer"], b["utterances"], b["words"], 1)
    assert a["wer"] <= 0.15
    # the same config.json: a local run can resume a Ray run's directory and back
    assert json.loads((out / "config.json").read_text()) == json.loads(
        (local_run / "config.json").read_text()
    )
    for name in ("table.md", "summary.json"):
        assert (out / name).is_file()


@pytest.mark.slow
def test_interrupted_ray_run_resumes_without_duplicates(local_ray, mini, local_run, tmp_path, monkeypatch):
    sent: list[list[str]] = []
    real_map, real_records = ray_runner.map_actors, ray_runner.RayEvaluator._records

    def counted(items, *args):
        sent.append([pickle.loads(i["utt"]).id for i in items])
        return real_map(items, *args)

    def interrupted_after_first(self, items):  # Ctrl-C once one utterance is decoded
        for rec in real_records(self, items):
            yield rec
            if rec["error"] is None:
                raise KeyboardInterrupt

    monkeypatch.setattr(ray_runner, "map_actors", counted)
    monkeypatch.setattr(ray_runner.RayEvaluator, "_records", interrupted_after_first)
    out = tmp_path / "ray"
    args = ["--data-dir", str(mini), *ARGS, "--ray", "-o", str(out)]
    result = _eval(*args)
    assert result.exit_code == 130 and "rerun the same command to resume" in result.stderr, result.output
    (first,) = [r for r in read_results(out / RESULTS) if r["error"] is None]
    with open(out / RESULTS, "a") as f:
        f.write('{"id": "half a line from a killed pro')  # a write cut short

    monkeypatch.setattr(ray_runner.RayEvaluator, "_records", real_records)
    result = _eval(*args)
    assert result.exit_code == 1 and "1 decode(s) failed" in result.stderr, result.output
    everything = ["1000-2000-0009", "1000-2000-0000", "1001-2001-0001"]
    assert sorted(sent[0]) == sorted(everything)
    assert sorted(sent[1]) == sorted(set(everything) - {first["id"]})  # the finished one is not sent
    records = read_results(out / RESULTS)
    assert sorted(r["id"] for r in records) == sorted(everything)  # no duplicates
    ok = {r["id"]: r["hypothesis"] for r in records if r["error"] is None}
    assert ok == {k: r["hypothesis"] for k, r in _by_id(local_run).items() if r["error"] is None}
    assert _summary(out)["wer"] == _summary(local_run)["wer"]

    result = _eval(*args)  # all done but the corrupt file, which is tried again (as locally)
    assert result.exit_code == 1 and sent[2] == ["1000-2000-0009"]
    assert sorted(r["id"] for r in read_results(out / RESULTS) if r["error"] is None) == sorted(ok)


def test_ray_options_are_checked_before_any_model_loads(local_ray, mini, tmp_path, monkeypatch):
    result = _eval("--data-dir", str(mini), "--workers", "2", "-o", str(tmp_path / "a"))
    assert result.exit_code == 2 and "--workers go(es) with --ray" in result.output
    # the local Ray has 2 CPUs: 3 one-CPU workers could never all start
    result = _eval("--data-dir", str(mini), "--ray", "--workers", "3", "-o", str(tmp_path / "b"))
    assert result.exit_code == 2 and "the Ray cluster has 2 CPU(s)" in result.output
    result = _eval("--data-dir", str(mini), "--ray", "--gpus-per-worker", "1", "-o", str(tmp_path / "c"))
    assert result.exit_code == 2 and "the Ray cluster has 0 GPU(s)" in result.output
    result = _eval("--data-dir", str(mini), "--ray", "--cpus-per-worker", "0", "-o", str(tmp_path / "d"))
    assert result.exit_code == 2 and "cpus_per_worker must be > 0" in result.output


def test_ray_without_ray_installed_says_how_to_install(mini, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.data", None)
    result = _eval("--data-dir", str(mini), "--ray", "-o", str(tmp_path))
    assert result.exit_code == 2 and "pip install 'specasr[ray]'" in result.output
    result = CliRunner().invoke(main, ["transcribe", str(tmp_path / "x.wav"), "--ray", "-o", str(tmp_path)])
    assert result.exit_code == 2 and "pip install 'specasr[ray]'" in result.output


@pytest.mark.parametrize(
    ("argv", "address", "inputs"),
    [
        (["--ray", "a.wav", "b.wav"], "local", ("a.wav", "b.wav")),  # an input, not an address
        (["a.wav", "--ray"], "local", ("a.wav",)),
        (["--ray", "auto", "a.wav"], "auto", ("a.wav",)),
        (["--ray", "head.example:6379", "a.wav"], "head.example:6379", ("a.wav",)),
        (["--ray", "ray://10.0.0.1:10001", "a.wav"], "ray://10.0.0.1:10001", ("a.wav",)),
        (["a.wav", "--", "--ray"], None, ("a.wav", "--ray")),
    ],
)
def test_a_bare_ray_before_an_input_means_a_local_ray(argv, address, inputs):
    from specasr.cli.transcribe import transcribe

    ctx = transcribe.make_context("transcribe", ["-o", "out", *argv])
    assert ctx.params["ray_address"] == address and ctx.params["inputs"] == inputs


@pytest.mark.slow
def test_ray_transcribe_writes_what_a_local_run_writes(local_ray, librivox, tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for clip in librivox[:2]:
        shutil.copy(clip.path, inputs / clip.path.name)
    (inputs / "broken.wav").write_bytes(b"RIFF not really")
    common = ["transcribe", str(inputs), "--model", "tiny.en", "--mode", "autoregressive"]
    common += ["--format", "txt", "--format", "srt"]
    local = CliRunner().invoke(main, [*common, "-o", str(tmp_path / "local")])
    assert local.exit_code == 1 and "files: 2 done, 0 skipped, 1 failed" in local.stderr, local.output
    args = [*common, "-o", str(tmp_path / "ray"), "--ray", "--workers", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "broken.wav" in result.stderr, result.output
    assert "files: 2 done, 0 skipped, 1 failed" in result.stderr, result.stderr[-3000:]
    for clip in librivox[:2]:
        for ext in ("txt", "srt"):
            ours = (tmp_path / "ray" / f"{clip.path.stem}.{ext}").read_text()
            assert ours == (tmp_path / "local" / f"{clip.path.stem}.{ext}").read_text() and ours.strip()
    again = CliRunner().invoke(main, [*args, "--skip-existing"])  # a rerun skips what is done
    assert again.exit_code == 1 and "files: 0 done, 2 skipped, 1 failed" in again.stderr, again.output
    no_dir = CliRunner().invoke(main, ["transcribe", str(inputs), "--ray"])
    assert no_dir.exit_code == 2 and "--ray writes files: give --output-dir" in no_dir.output


@pytest.mark.slow
def test_ray_eval_of_a_datasets_source_sends_the_audio_along(local_ray, librivox, local_run, tmp_path):
    """The two clips of `mini` as arrays in a save_to_disk dataset, under the same ids: the
    actors get the samples themselves (pickled with the utterance), not a path."""
    import soundfile as sf
    from datasets import Dataset

    good = {k: r for k, r in _by_id(local_run).items() if r["error"] is None}
    ids = sorted(good)  # make_librispeech numbers the clips in order
    rows = {"id": ids, "text": [c.text for c in librivox[:2]]}
    rows["audio"] = [
        {"array": sf.read(c.path, dtype="float32")[0], "sampling_rate": 16000} for c in librivox[:2]
    ]
    Dataset.from_dict(rows).save_to_disk(str(tmp_path / "ds"))
    out = tmp_path / "out"
    args = ["eval", "datasets", "--data-dir", str(tmp_path / "ds"), *ARGS, "--ray", "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert {k: r["hypothesis"] for k, r in _by_id(out).items()} == {
        k: r["hypothesis"] for k, r in good.items()
    }
    assert _summary(out)["wer"] == _summary(local_run)["wer"]
