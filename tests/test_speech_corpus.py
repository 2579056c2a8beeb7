"""The multilingual speech corpus (`specasr distill corpus --source …`), on small fake
package trees laid out like Debian's asterisk and fillets packages."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import soundfile as sf
from specasr.recipes import speech_corpus as sc


def _tone(seconds: float, freq: float) -> np.ndarray:
    t = np.arange(int(seconds * 16000)) / 16000
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.fixture
def asterisk(tmp_path, monkeypatch):
    """40 French prompts of 1–3 s at 8 kHz, and a transcript file with a non-speech note."""
    sounds, doc = tmp_path / "sounds", tmp_path / "doc"
    voice = sounds / sc.ASTERISK_VOICES["fr"]
    (voice / "digits").mkdir(parents=True)
    lines = ["; Core Asterisk Sounds in French", "", "beep: [a beep tone]"]
    for i in range(40):
        name = f"digits/{i}" if i < 10 else f"prompt-{i}"
        sf.write(voice / f"{name}.wav", _tone(1 + i % 3, 200 + 10 * i)[::2], 8000)
        lines.append(f"{name}: phrase numéro {i}.")
    sf.write(voice / "beep.wav", _tone(0.5, 1000)[::2], 8000)
    (doc / "asterisk-core-sounds-fr").mkdir(parents=True)
    with gzip.open(doc / "asterisk-core-sounds-fr" / "core-sounds-fr.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    monkeypatch.setattr(sc, "ASTERISK", sounds)
    monkeypatch.setattr(sc, "ASTERISK_DOC", doc)
    return voice


def test_sources_are_checked():
    assert sc.parse_source("asterisk:fr") == ("asterisk", "fr")
    assert sc.parse_source("espeak:de") == ("espeak", "de")
    for bad in ("asterisk:de", "fillets:fr", "tts", "espeak:", "espeak:../x"):
        with pytest.raises(ValueError, match="unknown source"):
            sc.parse_source(bad)
    with pytest.raises(ValueError):
        sc.SpeechCorpusOptions(sources=("nope:en",))


def test_asterisk_prompts_parse_and_notes_are_not_speech(asterisk):
    utts = sc.asterisk_utterances("fr")
    assert len(utts) == 40  # the bracketed beep has no spoken text
    assert utts[0].text == "phrase numéro 0." and utts[0].audio == asterisk / "digits" / "0.wav"
    assert len({u.group for u in utts}) == 40  # each prompt is its own hold-out group


def test_fillets_dialogue_parses_translations_and_english(tmp_path):
    level = tmp_path / "script" / "reef"
    level.mkdir(parents=True)
    (level / "dialogs_cs.lua").write_text(
        '\ndialogId("r-m-a", "font_small", "What is it?")\ndialogStr("Co to je?")\n\n'
        'dialogId("r-v-b", "font_big", "A \\"big\\" fish.")\ndialogStr("Velká \\"ryba\\".")\n',
        encoding="utf-8",
    )
    (level / "dialogs_en.lua").write_text('\ndialogId("r-m-a", "font_small", "What is it?")\n')
    assert sc.fillets_texts("cs", tmp_path) == {
        "r-m-a": ("reef", "Co to je?"),
        "r-v-b": ("reef", 'Velká "ryba".'),
    }
    assert sc.fillets_texts("en", tmp_path) == {"r-m-a": ("reef", "What is it?")}
    (tmp_path / "sound" / "reef" / "cs").mkdir(parents=True)
    sf.write(tmp_path / "sound" / "reef" / "cs" / "r-m-a.ogg", _tone(1, 300), 16000)
    utts = sc.fillets_utterances("cs", tmp_path)
    assert [(u.text, u.group) for u in utts] == [("Co to je?", "reef")]  # r-v-b has no recording


def test_hold_out_is_stable_and_by_group():
    groups = [f"level-{i}" for i in range(400)]
    held = [g for g in groups if sc.held_out("fillets:cs", g, 0.15)]
    assert held == [g for g in groups if sc.held_out("fillets:cs", g, 0.15)]  # no salted hash
    assert 30 < len(held) < 90
    assert held != [g for g in groups if sc.held_out("fillets:nl", g, 0.15)]  # per source


def test_corpus_windows_hold_out_whole_prompts_and_name_their_language(asterisk, tmp_path):
    out = tmp_path / "corpus"
    opts = sc.SpeechCorpusOptions(sources=("asterisk:fr",), windows=100, max_seconds=8.0, holdout=0.3, seed=3)
    sc.make_speech_corpus(out, opts)
    texts = {}
    for split in ("train", "heldout"):
        records = [json.loads(x) for x in (out / split / "corpus.jsonl").read_text().splitlines()]
        assert records, split
        for r in records:
            audio, rate = sf.read(out / split / r["path"], dtype="float32")
            assert rate == 16000 and 0.5 < len(audio) / rate <= 8.0
            assert np.abs(audio).max() > 0.01 and r["language"] == "fr" and r["source"] == "asterisk:fr"
        texts[split] = {t for r in records for t in r["texts"]}
        langs = sc.window_languages(out / split)
        assert set(langs.values()) == {"fr"} and len(langs) == len(records)
    assert not texts["train"] & texts["heldout"]  # a prompt is in one split only
    assert len(texts["train"] | texts["heldout"]) == 40  # and every prompt is used
    stamp = next((out / "train" / "asterisk-fr").iterdir()).stat().st_mtime_ns
    before = (out / "train" / "corpus.jsonl").read_text()
    sc.make_speech_corpus(out, opts)  # resumes: nothing rewritten
    assert (out / "train" / "corpus.jsonl").read_text() == before
    assert next((out / "train" / "asterisk-fr").iterdir()).stat().st_mtime_ns == stamp


def test_a_broken_recording_is_reported_and_the_corpus_goes_on(asterisk, tmp_path, capsys):
    (asterisk / "prompt-11.wav").write_bytes(b"RIFF broken")
    out = tmp_path / "corpus"
    sc.make_speech_corpus(out, sc.SpeechCorpusOptions(sources=("asterisk:fr",), windows=100, holdout=0.0))
    assert "prompt-11.wav" in capsys.readouterr().err
    records = [json.loads(x) for x in (out / "train" / "corpus.jsonl").read_text().splitlines()]
    spoken = {t for r in records for t in r["texts"]}
    assert "phrase numéro 11." not in spoken and len(spoken) == 39


def test_missing_packages_are_named(monkeypatch, tmp_path):
    monkeypatch.setattr(sc, "ASTERISK", tmp_path)
    monkeypatch.setattr(sc, "ASTERISK_DOC", tmp_path)
    assert sc.missing_packages(("asterisk:it",)) == ["asterisk-core-sounds-it", "asterisk-core-sounds-it-wav"]
    with pytest.raises(RuntimeError, match="apt-get install asterisk-core-sounds-it"):
        sc.make_speech_corpus(tmp_path / "x", sc.SpeechCorpusOptions(sources=("asterisk:it",)))


@pytest.mark.slow  # runs espeak-ng
def test_espeak_source_holds_out_its_voice(tmp_path, monkeypatch):
    level = tmp_path / "script" / "lvl"
    level.mkdir(parents=True)
    lua = "".join(
        f'dialogId("x-{i}", "f", "x")\ndialogStr("Guten Morgen, Nummer {i}.")\n\n' for i in range(6)
    )
    (level / "dialogs_de.lua").write_text(lua, encoding="utf-8")
    monkeypatch.setattr(sc, "FILLETS", tmp_path)
    out = tmp_path / "corpus"
    sc.make_speech_corpus(out, sc.SpeechCorpusOptions(sources=("espeak:de",), windows=2, holdout=0.0))
    records = [json.loads(x) for x in (out / "train" / "corpus.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["language"] == "de" for r in records)
    assert not (out / "heldout" / "corpus.jsonl").read_text().strip()  # one level, not held out


def test_a_corpus_languages_file_is_read_relative_to_its_split(tmp_path):
    (tmp_path / "corpus.jsonl").write_text(
        json.dumps({"id": "a", "path": "src/a.wav", "language": "cs"})
        + "\n"
        + json.dumps({"id": "w1"})
        + "\n"
    )
    assert sc.window_languages(tmp_path) == {"src/a.wav": "cs"}
    assert sc.window_languages(tmp_path / "nothing") == {}


def test_augmentation_keeps_length_and_adds_a_decaying_room_tail():
    x = np.zeros(16000, np.float32)
    x[100] = 1.0  # an impulse: the output is the dry impulse plus the room's response
    y = sc._reverb(x, np.random.default_rng(0))
    assert y.shape == x.shape and np.isfinite(y).all()
    tail = np.abs(y[200:])
    assert tail[:1600].mean() > 10 * tail[-1600:].mean() > 0  # the tail decays (RT60 ≤ 0.6 s)
    assert np.abs(y[:100]).max() < 1e-5  # causal: nothing before the impulse (FFT rounding aside)
    opts = sc.SpeechCorpusOptions(noise_share=0.0, reverb_share=1.0, speed_share=1.0, max_seconds=3.0)
    w = sc.render_window([_tone(1.0, 300), _tone(1.0, 500)], seed=4, opts=opts)
    assert w.dtype == np.float32 and 1.5 * 16000 < len(w) <= 3 * 16000 and np.abs(w).max() <= 1.0
