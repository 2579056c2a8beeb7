"""The tokenizer's decode table (specasr/tokenizer.py): on the real base and tiny.en
tokenizers it decodes exactly what `tokenizers` decodes (every id, and random sequences that
split multi-byte characters), gives the same special ids, is cached and rebuilt when the
cache is bad or unwritable, and spares a transcription the `tokenizers` parse."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel

from specasr.models.loading import offline_files
from specasr.tokenizer import DecodeTable, Tokenizer


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECASR_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module", params=["base", "tiny.en"])
def files(request):
    path = offline_files(request.param).tokenizer
    return path, HFTokenizer.from_file(str(path))


def test_every_id_decodes_as_tokenizers_does(files):
    path, hf = files
    tok = Tokenizer.from_file(path)
    assert tok.table is not None
    for tid in range(tok.eot):
        assert tok.decode([tid]) == hf.decode([tid], skip_special_tokens=False), tid


def test_random_sequences_decode_as_tokenizers_does(files):
    """Sequences of ids from the whole base vocabulary, most of them cutting UTF-8
    characters in two: the U+FFFD replacement must match too, not only clean text."""
    path, hf = files
    tok = Tokenizer.from_file(path)
    rng = random.Random(7)
    multibyte = [t for t in range(tok.eot) if any(b >= 0x80 for b in tok.table.decode([t]).encode())]
    replaced = 0
    for n in range(3000):
        pool = multibyte if n % 2 else range(tok.eot)
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 12))]
        ours = tok.decode(ids)
        assert ours == hf.decode(ids, skip_special_tokens=False), ids
        replaced += "\ufffd" in ours
    assert replaced > 100  # the invalid-UTF-8 path was exercised


def test_text_round_trips_and_timestamps_render(files):
    path, hf = files
    tok = Tokenizer.from_file(path)
    text = " Grüße, 東京! naïve café — 12.5% (ok?)"
    ids = tok.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids + [tok.eot]) == text
    stamped = [tok.timestamp_begin + 5, *ids, tok.timestamp_begin + 60]
    assert tok.decode_with_timestamps(stamped) == f"<|0.10|>{text}<|1.20|>"


def test_special_ids_equal_those_of_the_full_tokenizer(files):
    path, hf = files
    fast, full = Tokenizer.from_file(path), Tokenizer(hf)
    assert fast.table is not None and full.table is None
    for name in (
        "eot",
        "sot",
        "translate",
        "transcribe",
        "sot_lm",
        "sot_prev",
        "no_speech",
        "no_timestamps",
        "timestamp_begin",
        "language_tokens",
        "multilingual",
        "vocab_size",
    ):
        assert getattr(fast, name) == getattr(full, name), name
    for token in ("<|yue|>", "<|notatoken|>", "Ġthe", "hello"):
        assert fast._id(token) == hf.token_to_id(token), token
    assert fast.same_base_vocabulary(full) and fast.same_base_vocabulary(Tokenizer.from_file(path))


def test_table_is_cached_and_a_bad_entry_is_rebuilt(files, tmp_path):
    path, _ = files
    first = Tokenizer.from_file(path)
    assert first._hf is not None  # built: the full parse was needed once
    (entry,) = (tmp_path / "cache" / "tokenizers").iterdir()
    second = Tokenizer.from_file(path)
    assert second._hf is None and second.table == first.table  # read from the cache
    entry.write_bytes(entry.read_bytes()[:-7])  # truncated
    third = Tokenizer.from_file(path)
    assert third._hf is not None and third.table == first.table
    assert DecodeTable.from_bytes(entry.read_bytes()) == first.table  # rewritten whole
    with pytest.raises(ValueError):
        DecodeTable.from_bytes(b"SPECASR-DECODE-1" + bytes(40))


def test_unwritable_cache_still_decodes(files, tmp_path, monkeypatch):
    """The cache root is a file, so nothing can be stored (as for a read-only home)."""
    path, hf = files
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SPECASR_CACHE", str(blocker))
    tok = Tokenizer.from_file(path)
    assert tok.table is not None and tok.decode([1000, 2000]) == hf.decode([1000, 2000])


def test_other_tokenizers_decode_through_tokenizers(tmp_path):
    hf = HFTokenizer(WordLevel({"a": 0, "b": 1, "<|endoftext|>": 2}, unk_token="a"))
    path = tmp_path / "tokenizer.json"
    path.write_text(hf.to_str())
    assert DecodeTable.of(hf, json.loads(hf.to_str())) is None
    tok = Tokenizer.from_file(path)
    assert tok.table is None and tok.decode([0, 1]) == hf.decode([0, 1], skip_special_tokens=False)
    with pytest.raises(ValueError, match="needs a tokenizers.Tokenizer"):
        Tokenizer(table=None, path=path)


def test_decoding_does_not_import_tokenizers(tmp_path):
    """A transcription only decodes: after the cache is warm, loading and decoding leave the
    `tokenizers` extension unimported (its parse is what the table saves)."""
    path = offline_files("base").tokenizer
    code = (
        "import sys; from specasr.tokenizer import Tokenizer; "
        f"t = Tokenizer.from_file({str(path)!r}); t.decode([50, 60]); t.sot_sequence('de'); "
        "print('tokenizers' in sys.modules)"
    )
    env = {**os.environ, "SPECASR_CACHE": str(tmp_path / "c")}
    runs = [
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert [r.stdout.strip() for r in runs] == ["True", "False"]  # built once, then read
