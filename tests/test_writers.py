"""Every writer's output parses back: srt/vtt cue timing, tsv rows, json against its schema."""

from __future__ import annotations

import csv
import io
import json
import os
import re

import jsonschema
import pytest
from conftest import with_self_draft

from specasr import writers
from specasr.decode.stats import DecodeStats
from specasr.options import TranscribeOptions
from specasr.results import Segment, TranscriptionInfo
from specasr.transcription import transcribe

SRT_TIME = re.compile(r"^(\d{2}):(\d{2}):(\d{2}),(\d{3}) --> (\d{2}):(\d{2}):(\d{2}),(\d{3})$")
VTT_TIME = re.compile(r"^(\d{2}):(\d{2}):(\d{2})\.(\d{3}) --> (\d{2}):(\d{2}):(\d{2})\.(\d{3})$")


def _seconds(h, m, s, ms) -> float:
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def _synthetic() -> tuple[list[Segment], TranscriptionInfo]:
    stats = DecodeStats(proposed=10, accepted=7, target_calls=5, emitted=12, row_steps=5)
    texts = [
        " Hello there.",
        " A tab\there, an arrow --> and\nnew line.",
        " Über 3 600 s — ünïcode.",
        " Bye.",
    ]
    times = [(0.0, 1.234), (1.5, 59.9999), (3599.5, 3723.25), (3723.25, 3724.0)]
    segments = [
        Segment(i, a, b, t, [1, 2, 3], -0.25, 1.3, 0.01, 0.0, 0, stats)
        for i, (t, (a, b)) in enumerate(zip(texts, times))
    ]
    info = TranscriptionInfo("en", False, 3724.0, TranscribeOptions(), "tiny.en", "self:2", stats, 1)
    return segments, info


@pytest.fixture(scope="module")
def real(tiny_en_pair, librivox):
    segments, info = transcribe(librivox[0].path, with_self_draft(tiny_en_pair, 2), TranscribeOptions())
    return list(segments), info


@pytest.fixture(params=["synthetic", pytest.param("real", marks=pytest.mark.slow)])  # real: tiny.en
def transcript(request):
    return _synthetic() if request.param == "synthetic" else request.getfixturevalue("real")


def _cues(text: str) -> list[list[str]]:
    return [block.split("\n") for block in text.strip("\n").split("\n\n")]


def test_srt_parses(transcript):
    segments, info = transcript
    cues = _cues(writers.render_srt(segments, info))
    assert len(cues) == len(segments)
    for i, (cue, seg) in enumerate(zip(cues, segments), start=1):
        assert len(cue) == 3 and cue[0] == str(i)
        m = SRT_TIME.match(cue[1])
        assert m, cue[1]
        start, end = _seconds(*m.groups()[:4]), _seconds(*m.groups()[4:])
        assert start == pytest.approx(seg.start, abs=5e-4) and end == pytest.approx(seg.end, abs=5e-4)
        assert all(int(x) < 60 for x in (m.group(2), m.group(3), m.group(6), m.group(7)))
        assert cue[2] == " ".join(seg.text.split()).replace("-->", "->")


def test_vtt_parses(transcript):
    segments, info = transcript
    text = writers.render_vtt(segments, info)
    assert text.startswith("WEBVTT\n\n")
    cues = _cues(text.removeprefix("WEBVTT\n\n"))
    assert len(cues) == len(segments)
    for cue, seg in zip(cues, segments):
        m = VTT_TIME.match(cue[0])
        assert m and len(cue) == 2, cue
        assert _seconds(*m.groups()[:4]) == pytest.approx(seg.start, abs=5e-4)
        assert _seconds(*m.groups()[4:]) == pytest.approx(seg.end, abs=5e-4)
        assert "-->" not in cue[1]


def test_tsv_and_txt_parse(transcript):
    segments, info = transcript
    rows = list(csv.reader(io.StringIO(writers.render_tsv(segments, info)), delimiter="\t"))
    assert rows[0] == ["start", "end", "text"] and len(rows) == len(segments) + 1
    for row, seg in zip(rows[1:], segments):
        assert (
            len(row) == 3 and int(row[0]) == round(seg.start * 1000) and int(row[1]) == round(seg.end * 1000)
        )
    lines = writers.render_txt(segments, info).splitlines()
    assert [line.split() for line in lines] == [s.text.split() for s in segments]


def test_json_matches_its_schema(transcript):
    segments, info = transcript
    doc = json.loads(writers.render_json(segments, info))
    jsonschema.validate(doc, writers.JSON_SCHEMA)
    assert [s["id"] for s in doc["segments"]] == [s.id for s in segments]
    assert doc["segments"][0]["start"] == round(segments[0].start, 3)
    assert doc["info"]["language"] == "en" and doc["stats"]["proposed"] == info.stats.proposed
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"text": "x", "info": {}, "stats": {}, "segments": []}, writers.JSON_SCHEMA)


def test_write_all_formats(tmp_path):
    segments, info = _synthetic()
    paths = writers.write(segments, info, "clip", tmp_path)
    assert sorted(p.name for p in paths) == sorted(f"clip.{f}" for f in writers.FORMATS)
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in paths)  # no temporary files left


def test_write_is_atomic(tmp_path, monkeypatch):
    target = tmp_path / "clip.txt"
    target.write_text("old transcript\n")

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(writers.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        writers.write_atomic(target, "new transcript\n")
    assert target.read_text() == "old transcript\n"
    assert os.listdir(tmp_path) == ["clip.txt"]
