"""Every third-party module a test imports comes from a distribution the test install declares.

CI installs `pip install -e ".[offline,test,app]"` (the README's test command, `.ci/run`). A test
module that imports a package no extra declares passes here only because something else pulled
it in; on a clean machine it fails at collection. This test parses every test module (top-level
imports only, so guarded or lazy imports inside functions are left alone), maps each imported
top-level name to its distribution, and checks that the distribution is declared in
`dependencies` or in those extras, directly or as a requirement of a declared one.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; 3.10 has no TOML parser in the stdlib

ROOT = Path(__file__).resolve().parents[1]
TEST_DIRS = [ROOT / "tests", ROOT / "benchmarks" / "tests"]
# The extras the README's (and .ci/run's) test command installs.
TEST_COMMAND_RE = re.compile(r'pip install -e "\.\[([a-z0-9_,-]+)\]" && python3 -m pytest')
OWN = {"specasr", "benchmarks", "tests", "conftest"}


def normalise(name: str) -> str:
    """PEP 503 name normalisation: `Foo_Bar.baz` -> `foo-bar-baz`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    """`ray[data]>=2.50; python_version > '3'` -> `ray`."""
    return normalise(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec).group(1))


def ci_extras() -> list[str]:
    """The extras named by the test command in .ci/run (which the README repeats word for word)."""
    match = TEST_COMMAND_RE.search((ROOT / ".ci" / "run").read_text(encoding="utf-8"))
    assert match, '.ci/run: no `pip install -e ".[...]"` before pytest'
    return match.group(1).split(",")


def declared(pyproject: dict, extras: list[str]) -> set[str]:
    """Normalised names of `dependencies` and the given extras' requirements (no transitives)."""
    project = pyproject["project"]
    specs = list(project.get("dependencies", []))
    for extra in extras:
        specs += project.get("optional-dependencies", {}).get(extra, [])
    return {requirement_name(s) for s in specs}


def with_requirements(names: set[str]) -> set[str]:
    """`names` and, recursively, what their installed distributions require. Markers are not
    evaluated: a requirement behind any marker (an extra, a platform) counts as declared."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [requirement_name(r) for r in requires]
    return seen


def local_modules(folder: Path) -> set[str]:
    """Module and package names a test folder provides itself (helpers such as tiny_pairs)."""
    return {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()}


def top_level_imports(source: str) -> set[str]:
    """First components of the modules imported at a module's top level (absolute imports only)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def undeclared(
    files: list[Path],
    allowed: set[str],
    local: set[str],
    distributions: dict[str, list[str]],
) -> list[str]:
    """'path: module (distribution)' for each third-party import whose distribution is not
    `allowed`; a module no installed distribution provides is reported too."""
    problems = []
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
        except FileNotFoundError:  # moved or removed since the folder was listed
            continue
        for name in sorted(top_level_imports(source)):
            if name in sys.stdlib_module_names or name in OWN or name in local or name == "__future__":
                continue
            dists = {normalise(d) for d in distributions.get(name, [])}
            if not dists:
                problems.append(f"{path.name}: {name} (no installed distribution provides it)")
            elif not dists & allowed:
                problems.append(f"{path.name}: {name} ({', '.join(sorted(dists))}) is not declared")
    return problems


def _test_files() -> tuple[list[Path], set[str]]:
    files, local = [], set()
    for folder in TEST_DIRS:
        if folder.is_dir():
            files += sorted(folder.glob("*.py"))
            local |= local_modules(folder)
    return files, local


def test_test_imports_are_declared():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    extras = ci_extras()
    assert {"offline", "test", "app"} <= set(extras)
    allowed = with_requirements(declared(pyproject, extras))
    files, local = _test_files()
    assert len(files) > 10
    assert undeclared(files, allowed, local, md.packages_distributions()) == []


def test_an_undeclared_import_is_reported(tmp_path):
    fake = tmp_path / "test_fake.py"
    fake.write_text(
        "from __future__ import annotations\nimport os\nimport json.decoder\n"
        "import numpy as np\nfrom specasr import audio\nimport tiny_pairs\nimport scipy.optimize\n"
        "def later():\n    import yaml  # lazy: not checked\n"
    )
    distributions = {"numpy": ["numpy"], "scipy": ["SciPy"], "yaml": ["PyYAML"]}
    problems = undeclared([fake], {"numpy"}, {"tiny_pairs"}, distributions)
    assert problems == ["test_fake.py: scipy (scipy) is not declared"]
    assert undeclared([fake], {"numpy", "scipy"}, {"tiny_pairs"}, distributions) == []
    fake.write_text("import no_such_module_anywhere\n")
    assert undeclared([fake], {"numpy"}, set(), distributions) == [
        "test_fake.py: no_such_module_anywhere (no installed distribution provides it)"
    ]


def test_declared_names_and_transitives():
    pyproject = {
        "project": {
            "dependencies": ["Torch>=2.4", "triton>=3.0; platform_system == 'Linux'"],
            "optional-dependencies": {"test": ["ray[data]>=2.50", "Whisper_Normalizer"], "gpu": ["x"]},
        }
    }
    assert declared(pyproject, ["test"]) == {"torch", "triton", "ray", "whisper-normalizer"}
    # torch's own requirements count as declared (filelock, sympy, ... whatever is installed)
    assert with_requirements({"torch"}) > {"torch"}


def test_scipy_is_declared_for_test_words():
    """tests/test_words.py imports scipy: the test extra declares it (issue: no extra did)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    test = {requirement_name(s) for s in pyproject["project"]["optional-dependencies"]["test"]}
    assert {"scipy", "triton"} <= test
    assert "triton" not in {requirement_name(s) for s in pyproject["project"]["dependencies"]}
