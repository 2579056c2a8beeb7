"""`specasr eval` on bad input (issue 23): messages that name the file and line, not
tracebacks; usage errors before any model loads; a span past the end of its audio; Ctrl-C.

No real weights: the CLI's model loading is replaced by a tiny random pair, or by a stub
that fails the test when the models are loaded at all.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from specasr.recipes import DATASETS, DatasetError, Utterance

from specasr.audio import AudioError
from specasr.cli import main
from specasr.eval.runner import RESULTS, Evaluator, ResultsError, read_results


def _eval(*args: str):
    return CliRunner().invoke(main, ["eval", *args])


@pytest.fixture
def no_models(monkeypatch):
    """`specasr eval` must stop before it loads a model."""

    def refuse(*args, **kwargs):
        raise AssertionError("the models were loaded")

    monkeypatch.setattr("specasr.cli.eval.load_models", refuse)


@pytest.fixture(scope="module")
def tiny_pair():
    from tiny_pairs import random_tiny_pair

    return random_tiny_pair(seed=0)


@pytest.fixture
def tiny_models(monkeypatch, tiny_pair):
    """`specasr eval` decodes with a tiny random pair; returns the list of load calls."""
    calls = []

    def load(model, draft, mode, device, dtype, compute_type="float32", half_weights=None):
        calls.append(model)
        return tiny_pair

    monkeypatch.setattr("specasr.cli.eval.load_models", load)
    return calls


@pytest.fixture
def data(librivox, tmp_path):
    """tmp_path with two of the LibriVox clips, a.wav and b.wav."""
    for name, clip in zip("ab", librivox):
        shutil.copy(clip.path, tmp_path / f"{name}.wav")
    return tmp_path


def _manifest(path, lines: list[str]):
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = json.dumps({"audio": "a.wav", "text": "hello"})
TINY = ["--model", "tiny-random", "--modes", "autoregressive", "--max-new-tokens", "3"]


# --- a malformed manifest: file and line, exit 2, before any model loads ---------------------


def test_manifest_line_that_is_a_json_list_is_a_clear_error(data, no_models):
    m = _manifest(data / "m.jsonl", [GOOD, "[1, 2]"])
    with pytest.raises(DatasetError, match=r"m\.jsonl:2: expected a JSON object .* got list"):
        DATASETS["manifest"].load(m)
    result = _eval("manifest", "--data-dir", str(m), "-o", str(data / "out"))
    assert result.exit_code == 2, result.output
    assert f"error: {m}:2: expected a JSON object" in result.stderr
    assert isinstance(result.exception, SystemExit)  # a message, no traceback


@pytest.mark.parametrize(
    "kind, value", [(k, v) for k in ("jsonl", "csv") for v in ("abc", "", "nan", "-1")] + [("jsonl", [3])]
)
def test_manifest_row_with_a_bad_start_is_a_clear_error(data, no_models, value, kind):
    if kind == "csv":
        m = data / "m.csv"
        m.write_text(f"audio,text,start,end\na.wav,hi,0,1\na.wav,there,{value},2\n")
    else:
        m = _manifest(data / "m.jsonl", [GOOD, json.dumps({"audio": "a.wav", "text": "x", "start": value})])
    if value == "":  # an empty start is "from the beginning"
        assert len(DATASETS["manifest"].load(m)) == 2
        return
    line = 3 if kind == "csv" else 2
    with pytest.raises(DatasetError, match=rf"m\.{kind}:{line}: `start` must be a"):
        DATASETS["manifest"].load(m)
    result = _eval("manifest", "--data-dir", str(m), "-o", str(data / "out"))
    assert result.exit_code == 2, result.output
    assert f"{m}:{line}: `start` must be a" in result.stderr
    assert isinstance(result.exception, SystemExit)  # no traceback


def test_malformed_manifest_line_is_reported_at_its_real_line(data):
    m = _manifest(data / "m.jsonl", [GOOD, "", json.dumps({"audio": "b.wav", "text": "b"}), "", "{oops"])
    with pytest.raises(DatasetError, match=r"m\.jsonl:5: not valid JSON"):
        DATASETS["manifest"].load(m)
    # a row error counts blank lines too
    m = _manifest(data / "m.jsonl", ["", "", GOOD, json.dumps({"text": "no audio"})])
    with pytest.raises(DatasetError, match=r"m\.jsonl:4: a row needs `audio` and `text`"):
        DATASETS["manifest"].load(m)
    # a csv record spanning two lines: the line it ends on
    c = data / "m.csv"
    c.write_text('audio,text,end\na.wav,"two\nlines",1\nb.wav,x,-2\n')
    with pytest.raises(DatasetError, match=r"m\.csv:4: `end`"):
        DATASETS["manifest"].load(c)


def test_other_malformed_manifests(data):
    load = DATASETS["manifest"].load
    m = _manifest(data / "m.jsonl", [GOOD, json.dumps({"id": "000000", "audio": "b.wav", "text": "b"})])
    with pytest.raises(DatasetError, match=r"m\.jsonl:2: id '000000' is already on line 1"):
        load(m)
    m = _manifest(data / "m.jsonl", [json.dumps({"audio": "a.wav", "text": "x", "start": 2, "end": 1})])
    with pytest.raises(DatasetError, match=r"m\.jsonl:1: the span ends at 1 s, not after its start"):
        load(m)
    m = _manifest(data / "m.jsonl", [json.dumps({"audio": 5, "text": "x"})])
    with pytest.raises(DatasetError, match=r"m\.jsonl:1: `audio` and `text` must be strings"):
        load(m)
    m = _manifest(data / "m.jsonl", [json.dumps({"audio": "a.wav", "text": "x", "id": ["x"]})])
    with pytest.raises(DatasetError, match=r"m\.jsonl:1: `id` must be a string"):
        load(m)
    ids = [0, "", None]  # 0 is an id; "" and None take the row number
    m = _manifest(data / "m.jsonl", [json.dumps({"audio": "a.wav", "text": "x", "id": i}) for i in ids])
    assert [u.id for u in load(m)] == ["0", "000001", "000002"]
    with pytest.raises(DatasetError, match="no utterances"):
        load(_manifest(data / "m.jsonl", ["", " "]))
    (data / "bin.jsonl").write_bytes(b'{"audio": "a.wav", "text": "\xff"}\n')
    with pytest.raises(DatasetError, match=r"bin\.jsonl: not UTF-8"):
        load(data / "bin.jsonl")
    # a byte-order mark (spreadsheet exports) is not part of the first column's name
    (data / "bom.csv").write_bytes(b"\xef\xbb\xbfaudio,text\na.wav,hi\n")
    assert [u.text for u in load(data / "bom.csv")] == ["hi"]


def test_tedlium_stm_line_with_a_bad_time_names_file_and_line(data, no_models):
    (data / "ted" / "stm").mkdir(parents=True)
    (data / "ted" / "sph").mkdir()
    stm = data / "ted" / "stm" / "talk.stm"
    stm.write_text(";; comment\ntalk 1 spk 0.00 1.00 <o,f0,male> hello\ntalk 1 spk 1.00 two <o> x\n")
    with pytest.raises(DatasetError, match=r"talk\.stm:3: start and end must be seconds"):
        DATASETS["tedlium3"].load(data / "ted")
    result = _eval("tedlium3", "--data-dir", str(data / "ted"))
    assert result.exit_code == 2 and f"error: {stm}:3: " in result.stderr


# --- a corrupt results.jsonl in a resumed run ------------------------------------------------


def test_corrupt_results_line_names_the_file_and_line_and_how_to_recover(data, tiny_models):
    m = _manifest(data / "m.jsonl", [GOOD, json.dumps({"audio": "b.wav", "text": "b"})])
    out = data / "out"
    result = _eval("manifest", "--data-dir", str(m), *TINY, "-o", str(out))
    assert result.exit_code == 0, result.output
    assert len(read_results(out / RESULTS)) == 2 and len(tiny_models) == 1
    lines = (out / RESULTS).read_text().splitlines(keepends=True)
    for bad in ("not json at all\n", "[1, 2]\n", '{"id": "000000"}\n'):
        (out / RESULTS).write_text(lines[0] + bad + lines[1])
        with pytest.raises(ResultsError, match=r"results\.jsonl:2: "):
            read_results(out / RESULTS)
        result = _eval("manifest", "--data-dir", str(m), *TINY, "-o", str(out))
        assert result.exit_code == 2, result.output
        assert f"error: {out / RESULTS}:2: " in result.stderr
        assert "Delete that line" in result.stderr and "another --output-dir" in result.stderr
        assert len(tiny_models) == 1  # found before the models load
        merged = _eval("merge", str(out), "-o", str(data / "merged"))
        assert merged.exit_code == 2 and f"{out / RESULTS}:2: " in merged.stderr
    (out / RESULTS).write_text(lines[0])  # the advice works: the line deleted, it is decoded again
    result = _eval("manifest", "--data-dir", str(m), *TINY, "-o", str(out))
    assert result.exit_code == 0, result.output
    assert len(read_results(out / RESULTS)) == 2


# --- a span past the end of its audio --------------------------------------------------------


def test_span_past_the_end_of_the_audio_says_so(data):
    import soundfile as sf

    seconds = sf.info(data / "a.wav").duration
    past = Utterance("late", str(data / "a.wav"), "x", seconds + 10, seconds + 15)
    with pytest.raises(AudioError, match=rf"starts past the end of the audio \({seconds:.2f} s\)") as e:
        past.load()
    assert f"{seconds + 10:.2f}–{seconds + 15:.2f} s" in str(e.value)
    with pytest.raises(AudioError, match="past the end"):
        Utterance("open", str(data / "a.wav"), "x", seconds + 1, None).load()
    # a span that only ends past the end is cut at the end, as before
    assert len(Utterance("tail", str(data / "a.wav"), "x", seconds - 1, seconds + 1).load()) == 16000


def test_eval_records_a_span_past_the_end_and_goes_on(data, tiny_models):
    rows = [
        {"id": "ok", "audio": "a.wav", "text": "x"},
        {"id": "z", "audio": "a.wav", "text": "y", "start": 500},
    ]
    m = _manifest(data / "m.jsonl", [json.dumps(r) for r in rows])
    result = _eval("manifest", "--data-dir", str(m), *TINY, "-o", str(data / "out"))
    assert result.exit_code == 1, result.output
    ok, late = read_results(data / "out" / RESULTS)
    assert ok["error"] is None and "past the end of the audio" in late["error"]
    assert "NaN" not in late["error"]


# --- usage errors before any model loads -----------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--modes", "fast"],
        ["--modes", "exact,fast"],
        ["--shard", "2/2"],
        ["--shard", "x"],
        ["--shard", "1/0"],
        ["--batch-size", "0"],
        ["--limit", "0"],
        ["--fraction", "1.5"],
        ["--temperature", "-1"],
        ["--gamma", "0"],
        ["--max-new-tokens", "0"],
    ],
)
def test_usage_errors_exit_2_before_loading_models(data, no_models, args):
    m = _manifest(data / "m.jsonl", [GOOD])
    result = _eval("manifest", "--data-dir", str(m), *args, "-o", str(data / "out"))
    assert result.exit_code == 2, result.output
    assert "Error" in result.stderr and not (data / "out").exists()


def test_missing_data_and_another_configuration_exit_2_before_loading_models(data, tiny_models):
    result = _eval("manifest", "--data-dir", str(data / "none.jsonl"), *TINY)
    assert result.exit_code == 2 and "none.jsonl is not a file" in result.stderr
    result = _eval("librispeech-clean", "--data-dir", str(data / "nothing"), *TINY)
    assert result.exit_code == 2 and "error: " in result.stderr
    assert tiny_models == []
    m = _manifest(data / "m.jsonl", [GOOD])
    assert _eval("manifest", "--data-dir", str(m), *TINY, "-o", str(data / "out")).exit_code == 0
    result = _eval("manifest", "--data-dir", str(m), *TINY, "--temperature", "0.5", "-o", str(data / "out"))
    assert result.exit_code == 2 and "another configuration" in result.output
    (data / "out" / "config.json").write_text("{not json")
    result = _eval("manifest", "--data-dir", str(m), *TINY, "-o", str(data / "out"))
    assert result.exit_code == 2 and "config.json: not an eval run's configuration" in result.stderr
    assert len(tiny_models) == 1  # the first run's


def test_a_run_in_another_compute_type_does_not_resume_into_the_first(data, tiny_pair, monkeypatch):
    """config.json records the target's compute type: an int8 rerun into an fp32 run's
    directory is refused (exit 2), and the loader is told the compute type."""
    from dataclasses import replace

    asked = []

    def load(model, draft, mode, device, dtype, compute_type="float32", half_weights=None):
        asked.append(compute_type)
        return replace(tiny_pair, compute_type=compute_type)

    monkeypatch.setattr("specasr.cli.eval.load_models", load)
    m = _manifest(data / "m.jsonl", [GOOD])
    out = str(data / "out")
    assert _eval("manifest", "--data-dir", str(m), *TINY, "-o", out).exit_code == 0
    assert json.loads((data / "out" / "config.json").read_text())["compute_type"] == "float32"
    result = _eval("manifest", "--data-dir", str(m), *TINY, "--compute-type", "int8", "-o", out)
    assert result.exit_code == 2 and "another configuration" in result.output
    assert asked == ["float32", "int8"]


# --- Ctrl-C ----------------------------------------------------------------------------------


def test_interrupt_says_what_was_done_and_exits_130(data, tiny_models, monkeypatch):
    rows = [{"audio": f"{n}.wav", "text": n} for n in "ab"]
    m = _manifest(data / "m.jsonl", [json.dumps(r) for r in rows])
    out = data / "out"
    real, calls = Evaluator._decode_group, []

    def interrupted_at_second(self, group, samples, mode):
        calls.append(group[0].id)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, group, samples, mode)

    monkeypatch.setattr(Evaluator, "_decode_group", interrupted_at_second)
    result = _eval("manifest", "--data-dir", str(m), *TINY, "-o", str(out))
    assert result.exit_code == 130, result.output
    assert "interrupted: 1 of 2 decodes done (1 written by this run)" in result.stderr
    assert "rerun the same command to resume" in result.stderr
    assert len(read_results(out / RESULTS)) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["modes"]["autoregressive"]["decoded"] == 1
    assert "| autoregressive |" in result.stdout  # the table of what is done

    calls.clear()  # the rerun decodes only what the interrupted run did not
    result = _eval("manifest", "--data-dir", str(m), *TINY, "-o", str(out))
    assert result.exit_code == 0, result.output
    assert calls == ["000001"]


def test_interrupt_while_loading_models_exits_130(data, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("specasr.cli.eval.load_models", interrupted)
    m = _manifest(data / "m.jsonl", [GOOD])
    result = _eval("manifest", "--data-dir", str(m), "-o", str(data / "out"))
    assert result.exit_code == 130, result.output
    assert "interrupted before decoding began; nothing was decoded" in result.stderr
