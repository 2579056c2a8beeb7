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
from specasr.options import TranscribeOptions
from specasr.results import Segment, TranscriptionInfo
from specasr.stats import DecodeStats
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


# ---- word timestamps --------------------------------------------------------------------------
def _worded() -> tuple[list[Segment], TranscriptionInfo]:
    from specasr.results import Word

    stats = DecodeStats()
    words = [
        [Word(" Hello", 0.0, 0.5, 0.91), Word(" there.", 0.6, 1.2, 0.82)],
        [Word(" General", 5.0, 5.5, 0.7), Word(" Kenobi,", 5.5, 6.25, 0.6)]
        + [Word(" you", 6.25, 6.5, 0.99), Word(" are", 6.5, 7.0, 0.98), Word(" bold-->", 7.0, 8.0, 0.5)],
    ]
    segments = [
        Segment(
            i,
            ws[0].start,
            ws[-1].end,
            "".join(w.word for w in ws),
            [1],
            -0.2,
            1.2,
            0.01,
            0.0,
            0,
            stats,
            words=ws,
        )
        for i, ws in enumerate(words)
    ]
    return segments, TranscriptionInfo(
        "en", False, 9.0, TranscribeOptions(word_timestamps=True), "tiny.en", None
    )


def _srt(segments, info, **kw) -> list[tuple[float, float, str]]:
    """(start, end, text) of each srt cue; a cue's lines joined by "|"."""
    out = []
    for i, cue in enumerate(
        _cues(writers.render_srt(segments, info, writers.SubtitleOptions(**kw))), start=1
    ):
        m = SRT_TIME.match(cue[1])
        assert cue[0] == str(i) and m, cue
        out.append((_seconds(*m.groups()[:4]), _seconds(*m.groups()[4:]), "|".join(cue[2:])))
    return out


def test_srt_with_words_keeps_one_cue_per_segment_by_default():
    segments, info = _worded()
    assert _srt(segments, info) == [(0.0, 1.2, "Hello there."), (5.0, 8.0, "General Kenobi, you are bold->")]
    vtt = writers.render_vtt(segments, info)
    assert "00:00:05.000 --> 00:00:08.000\nGeneral Kenobi, you are bold->\n" in vtt


def test_srt_lines_and_cues_follow_width_and_count():
    segments, info = _worded()
    one_line = _srt(segments, info, max_line_width=12, max_line_count=1)
    assert one_line == [
        (0.0, 1.2, "Hello there."),  # 12 characters fit; the 3.8 s pause then starts a new cue
        (5.0, 5.5, "General"),
        (5.5, 6.5, "Kenobi, you"),
        (6.5, 8.0, "are bold->"),
    ]
    two_lines = _srt(segments, info, max_line_width=12, max_line_count=2)
    assert two_lines == [
        (0.0, 1.2, "Hello there."),
        (5.0, 6.5, "General|Kenobi, you"),
        (6.5, 8.0, "are bold->"),
    ]
    wrapped = _srt(segments, info, max_line_width=12)  # no count: segments stay cues, lines wrap
    assert wrapped == [(0.0, 1.2, "Hello there."), (5.0, 8.0, "General|Kenobi, you|are bold->")]
    with pytest.raises(ValueError, match="max_line_width"):
        writers.SubtitleOptions(max_line_width=0)


def test_highlight_words_underlines_each_word_in_turn():
    segments, info = _worded()
    cues = _srt(segments[:1], info, highlight_words=True)
    assert cues == [
        (0.0, 0.5, "<u>Hello</u> there."),
        (0.5, 0.6, "Hello there."),  # the gap between the words
        (0.6, 1.2, "Hello <u>there.</u>"),
    ]


def test_words_go_into_json_and_tsv():
    segments, info = _worded()
    doc = json.loads(writers.render_json(segments, info))
    jsonschema.validate(doc, writers.JSON_SCHEMA)
    assert doc["segments"][0]["words"] == [
        {"word": " Hello", "start": 0.0, "end": 0.5, "probability": 0.91},
        {"word": " there.", "start": 0.6, "end": 1.2, "probability": 0.82},
    ]
    rows = list(csv.reader(io.StringIO(writers.render_tsv(segments, info)), delimiter="\t"))
    assert rows[0] == ["start", "end", "text", "probability"] and len(rows) == 1 + 7
    assert rows[1] == ["0", "500", "Hello", "0.9100"] and rows[5] == ["6250", "6500", "you", "0.9900"]
    plain, _ = _synthetic()  # without words: neither gains anything
    assert "words" not in json.loads(writers.render_json(plain, info))["segments"][0]
