"""The folder mapping: kernels/, apps/ and recipes/ import under specasr, never top level."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_a_checkout_imports_as_the_installed_package(tmp_path):
    """From a copy of the source tree (as after a non-editable install, run from the repo
    root), specasr.kernels/apps/recipes resolve to that tree's top-level folders."""
    import shutil

    for name in ("specasr", "kernels", "apps", "recipes"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    probe = (
        "import specasr, specasr.kernels, specasr.apps, specasr.recipes\n"
        "from specasr import DecodeOptions, transcribe\n"
        "print(specasr.__file__); print(specasr.kernels.__file__); print(specasr.apps.__file__)\n"
        "print(specasr.recipes.__file__); print(callable(transcribe), DecodeOptions().mode)"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert all(line.startswith(str(tmp_path)) for line in lines[:4]), lines
    assert [Path(p).parent.name for p in lines[1:4]] == ["kernels", "apps", "recipes"]
    assert lines[4:] == ["True", "exact"]


def test_every_package_folder_is_listed_for_the_wheel():
    """A non-editable install ships only the packages pyproject lists: a subpackage missing
    there imports from a checkout but not from the wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"specasr"} | {
        "specasr." + ".".join(p.parent.relative_to(ROOT / "specasr").parts)
        for p in (ROOT / "specasr").rglob("__init__.py")
        if p.parent != ROOT / "specasr"
    }
    found |= {f"specasr.{name}" for name in ("kernels", "apps", "recipes")}
    assert found == listed, (found - listed, listed - found)


def test_the_fused_draft_steps_c_source_ships_in_the_wheel():
    """`specasr.backends.cpu.fused` compiles its C source from the installed package on first use: the
    wheel must carry it (package data, not a module)."""
    import tomllib

    from specasr.backends.cpu import fused

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert fused.SOURCE in data["specasr.backends.cpu"]
    assert (ROOT / "specasr" / "backends" / "cpu" / fused.SOURCE).is_file()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout (so no build/ is left in it, nor a stale one
    read), benchmarks/ included in the copy: the wheel must leave it out."""
    import shutil

    src = tmp_path_factory.mktemp("src")
    for name in ("specasr", "kernels", "apps", "recipes", "benchmarks"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src)
    out = src / "dist"
    build = ["pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), "."]
    subprocess.run([sys.executable, "-m", *build], cwd=src, check=True, capture_output=True)
    (path,) = out.glob("specasr-*.whl")
    return path


@pytest.mark.slow  # a wheel build: 5-10 s on a 2-core CPU
def test_the_wheel_holds_the_package_and_not_the_lab(wheel):
    import zipfile

    from specasr.backends.cpu import fused

    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("benchmarks/") or "research" in n.split("/")]
    for name in (
        "specasr/runtime/forms.py",
        f"specasr/backends/cpu/{fused.SOURCE}",
        "specasr/eval/bench.py",
        "specasr/cli/bench.py",
        "specasr/kernels/bench.py",
        "specasr/assets/example.wav",
    ):
        assert name in names, name


@pytest.mark.slow  # the same wheel
def test_specasr_bench_runs_from_the_wheel_without_the_checkout(wheel, tmp_path):
    """`specasr bench` (specasr/eval/bench.py) imports nothing from benchmarks/: from the unpacked
    wheel, outside the checkout, its module imports and its --help runs."""
    import os
    import zipfile

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = os.environ | {"PYTHONPATH": str(site)}
    probe = (
        "import sys, specasr, specasr.eval.bench, specasr.cli.bench\n"
        "print(specasr.__file__); print('benchmarks' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(site / "specasr" / "__init__.py"), "False"], out.stdout
    bench = [sys.executable, "-m", "specasr", "bench", "--help"]
    help_ = subprocess.run(bench, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert help_.returncode == 0 and "--repeats" in help_.stdout, help_.stderr
