"""Dataset recipes on mini datasets built in each native layout from the LibriVox fixtures."""

from __future__ import annotations

import io
import json
import tarfile
import urllib.error

import numpy as np
import pytest
import soundfile as sf
from specasr.recipes import DATASETS, DatasetError, DownloadError, Utterance
from specasr.recipes import librispeech as ls_recipe

SR = 16000


def _samples(clip) -> np.ndarray:
    x, sr = sf.read(clip.path, dtype="float32")
    assert sr == SR
    return x


def make_librispeech(root, clips):
    """root/LibriSpeech/test-clean/SPEAKER/CHAPTER/*.flac + trans.txt -> {id: clip}."""
    ids = {}
    for n, clip in enumerate(clips):
        speaker, chapter = 1000 + n % 2, 2000 + n % 2
        d = root / "LibriSpeech" / "test-clean" / str(speaker) / str(chapter)
        d.mkdir(parents=True, exist_ok=True)
        utt = f"{speaker}-{chapter}-{n:04d}"
        sf.write(d / f"{utt}.flac", _samples(clip), SR, format="FLAC")
        with open(d / f"{speaker}-{chapter}.trans.txt", "a") as f:
            f.write(f"{utt} {clip.text.upper()}\n")
        ids[utt] = clip
    return ids


def test_librispeech_parses_ids_texts_and_audio(librivox, tmp_path):
    ids = make_librispeech(tmp_path, librivox)
    utts = DATASETS["librispeech-clean"].load(tmp_path)
    assert [u.id for u in utts] == sorted(ids)
    for u in utts:
        assert u.text == ids[u.id].text.upper() and (u.start, u.end) == (None, None)
        np.testing.assert_allclose(u.load(), _samples(ids[u.id]), atol=1e-4)  # flac is lossless
    # the split directory itself works too; the other split is not there
    assert len(DATASETS["librispeech-clean"].load(tmp_path / "LibriSpeech" / "test-clean")) == 5
    with pytest.raises(DatasetError, match="test-other"):
        DATASETS["librispeech-other"].load(tmp_path / "nothing")


def _pad(x: np.ndarray) -> np.ndarray:
    """Zero-pads to whole 10 ms frames, so stm times with two decimals are exact."""
    return np.concatenate([x, np.zeros(-len(x) % 160, dtype=x.dtype)])


def make_tedlium(root, clips):
    """Two talks in root/stm + root/sph; talk A has silences and an ignore segment.
    -> {utterance id: clip}."""
    (root / "stm").mkdir(parents=True)
    (root / "sph").mkdir()
    silence = np.zeros(SR, dtype=np.float32)
    expected = {}
    for talk, part in (("TalkA_2010", clips[:3]), ("TalkB_2011", clips[3:])):
        audio, lines, t = [silence], [], 1.0
        lines.append(f"{talk} 1 {talk} 0.00 1.00 <o,f0,male> ignore_time_segment_in_scoring")
        for clip in part:
            x = _pad(_samples(clip))
            end = t + len(x) / SR
            words = clip.text.split()
            text = " ".join(words[:1] + ["<unk>"] + words[1:])  # <unk> is dropped by the recipe
            lines.append(f"{talk} 1 {talk} {t:.2f} {end:.2f} <o,f0,male> {text}")
            expected[f"{talk}-{round(t * 100):07d}-{round(end * 100):07d}"] = clip
            audio += [x, silence]
            t = end + 1.0
        sf.write(root / "sph" / f"{talk}.sph", np.concatenate(audio), SR, format="NIST", subtype="PCM_16")
        (root / "stm" / f"{talk}.stm").write_text("\n".join(lines) + "\n")
    return expected


def test_tedlium_cuts_stm_spans_and_drops_ignore_segments(librivox, tmp_path):
    expected = make_tedlium(tmp_path, librivox)
    utts = DATASETS["tedlium3"].load(tmp_path)
    assert [u.id for u in utts] == sorted(expected)  # the two ignore segments are gone
    for u in utts:
        clip = expected[u.id]
        assert u.text == clip.text
        assert u.audio_path.endswith(".sph") and u.start >= 1.0
        x = u.load()
        ref = _pad(_samples(clip))
        assert len(x) == len(ref)
        np.testing.assert_allclose(x, ref, atol=1e-4)


def test_tedlium_contractions_and_bad_layout(tmp_path):
    from specasr.recipes.tedlium import clean

    assert clean("it 's what i 'd <unk> say") == "it's what i'd say"
    with pytest.raises(DatasetError, match="stm/ and sph/"):
        DATASETS["tedlium3"].load(tmp_path)


def test_commonvoice_reads_tsv_and_decodes_mp3(librivox, tmp_path):
    (tmp_path / "clips").mkdir()
    rows = ["client_id\tpath\tsentence\tup_votes\tdown_votes\tage\tgender\taccents\tlocale\tsegment"]
    for n, clip in enumerate(librivox[:2]):
        name = f"common_voice_en_{n}.mp3"
        sf.write(tmp_path / "clips" / name, _samples(clip), SR, format="MP3")
        rows.append(f'abc{n}\t{name}\t{clip.text.capitalize()}, "quoted".\t2\t0\t\t\t\ten\t')
    (tmp_path / "test.tsv").write_text("\n".join(rows) + "\n")
    utts = DATASETS["cv16-en"].load(tmp_path)
    assert [u.id for u in utts] == ["common_voice_en_0", "common_voice_en_1"]
    for u, clip in zip(utts, librivox[:2]):
        assert u.text == f'{clip.text.capitalize()}, "quoted".'
        x, ref = u.load(), _samples(clip)
        assert abs(len(x) - len(ref)) < 0.1 * SR  # mp3 encoder delay and padding only
        assert np.sqrt(np.mean(x**2)) == pytest.approx(np.sqrt(np.mean(ref**2)), rel=0.2)


def test_commonvoice_download_says_what_to_do(tmp_path):
    with pytest.raises(DownloadError, match="account") as e:
        DATASETS["cv16-en"].download(tmp_path)
    assert "test.tsv and clips/" in str(e.value)
    with pytest.raises(DatasetError, match="commonvoice.mozilla.org"):
        DATASETS["cv16-en"].load(tmp_path)


def test_manifest_jsonl_and_csv_with_offsets(librivox, tmp_path):
    clip = librivox[0]
    rows = [
        {"id": "whole", "audio": str(clip.path), "text": clip.text},
        {"id": "part", "audio": clip.path.name, "text": "x", "offset": 0.5, "duration": 1.0},
    ]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / clip.path.name).write_bytes(clip.path.read_bytes())
    (tmp_path / "m.csv").write_text(f"audio,text,start,end\n{clip.path.name},y,0.25,0.75\n")
    part, whole = DATASETS["manifest"].load(tmp_path / "m.jsonl")
    assert (whole.id, whole.text, whole.start) == ("whole", clip.text, None)
    assert (part.start, part.end) == (0.5, 1.5)
    np.testing.assert_allclose(part.load(), _samples(clip)[8000:24000], atol=1e-4)
    (row,) = DATASETS["manifest"].load(tmp_path / "m.csv")
    assert (row.id, row.text, row.start, row.end) == ("000000", "y", 0.25, 0.75)
    assert len(row.load()) == 8000
    with pytest.raises(DatasetError, match="not a file"):
        DATASETS["manifest"].load(tmp_path / "missing.jsonl")


def test_librispeech_download_urls_and_network_error(tmp_path, monkeypatch):
    assert ls_recipe.url("test-clean") == "https://www.openslr.org/resources/12/test-clean.tar.gz"
    assert ls_recipe.url("test-other") == "https://www.openslr.org/resources/12/test-other.tar.gz"

    def offline(url, timeout):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr("urllib.request.urlopen", offline)
    with pytest.raises(DownloadError, match="test-clean.tar.gz.*unreachable"):
        DATASETS["librispeech-clean"].download(tmp_path)
    assert not list(tmp_path.iterdir())  # no partial archive left behind


def test_download_unpacks_into_the_cache_once(librivox, tmp_path, monkeypatch):
    src = tmp_path / "src"
    make_librispeech(src, librivox[:1])
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.add(src / "LibriSpeech", arcname="LibriSpeech")
    calls = []

    def serve(url, timeout):
        calls.append(url)
        return io.BytesIO(archive.getvalue())

    monkeypatch.setattr("urllib.request.urlopen", serve)
    cache = tmp_path / "cache"
    for _ in range(2):
        data_dir = DATASETS["librispeech-clean"].download(cache)
        (utt,) = DATASETS["librispeech-clean"].load(data_dir)
        assert isinstance(utt, Utterance) and utt.id == "1000-2000-0000"
    assert calls == [ls_recipe.url("test-clean")]
