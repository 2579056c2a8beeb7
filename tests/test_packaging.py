"""The folder mapping: kernels/, apps/ and recipes/ import under specasr, never top level."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mapped_packages_import_from_their_folders():
    for name, folder in (
        ("specasr.kernels", "kernels"),
        ("specasr.apps", "apps"),
        ("specasr.recipes", "recipes"),
    ):
        module = importlib.import_module(name)
        assert Path(module.__file__).resolve().parent.name == folder


def test_no_top_level_kernels_module(tmp_path):
    """Outside the source tree, `kernels` is absent or Hugging Face's PyPI package: never ours."""
    probe = "import importlib.util as u; s = u.find_spec('kernels'); print(s.origin if s else None)"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert not out.stdout.strip().startswith(str(ROOT)), out.stdout
    assert not (ROOT / "specasr" / "kernels").exists()


def test_console_entry_points_run():
    out = subprocess.run(
        [sys.executable, "-m", "specasr", "--help"], capture_output=True, text=True, check=True
    )
    assert "transcribe" in out.stdout and "bench" in out.stdout and "models" in out.stdout
