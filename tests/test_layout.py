"""The package's shape: few top-level modules, no import cycles, a lazy top-level API."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "specasr": ROOT / "specasr",
    "specasr.kernels": ROOT / "kernels",
    "specasr.apps": ROOT / "apps",
    "specasr.recipes": ROOT / "recipes",
}


def _modules() -> dict[str, Path]:
    """Every project module by import name."""
    out = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            if package == "specasr" and rel[0] in ("kernels", "apps", "recipes"):
                continue
            parts = rel[:-1] if rel[-1] == "__init__" else rel
            out[".".join((package, *parts))] = path
    return out


def _imported(node: ast.AST, package: str, known: set[str]) -> set[str]:
    """The modules one import statement names (relative ones resolved against `package`);
    empty for any other node."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:
        up = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
    return {f"{base}.{a.name}" for a in node.names} & known or {base}  # `from . import exact`


def _project_modules(found: set[str], known: set[str]) -> set[str]:
    """Each imported name as the project module that holds it (outside ones dropped)."""
    out = set()
    for mod in found:
        while mod and mod not in known:
            mod = mod.rpartition(".")[0]
        if mod:
            out.add(mod)
    return out


def _package_of_file(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports_at_load(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules imported when `name` is loaded: module-level imports only (imports
    inside functions run later and cannot make a load-time cycle), TYPE_CHECKING excluded."""
    tree = ast.parse(path.read_text())
    package = _package_of_file(name, path)
    found = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body + node.orelse + getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            else:
                found.update(_imported(node, package, known))

    visit(tree.body)
    # a module's own packages are already loading when it runs: not a dependency
    return {m for m in _project_modules(found, known) if m != name and not name.startswith(m + ".")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles():
    modules = _modules()
    graph = {name: _imports_at_load(name, path, set(modules)) for name, path in modules.items()}
    assert "specasr.decode.step" in graph["specasr.decode.loop"]  # the parser sees real imports
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_at_most_eleven_modules_directly_under_specasr():
    """Stage modules at the top (the package's own `__init__` and `__main__` are not stages),
    and `model`, the faster-whisper-shaped front door over `transcription`."""
    top = sorted(p.name for p in (ROOT / "specasr").glob("*.py") if not p.name.startswith("__"))
    assert len(top) <= 11, top


# The package's layers, highest first (docs/design.md): a package may import only packages of
# a lower layer. Top-level modules count as packages of their own.
LAYERS = (
    ("__main__",),  # `python -m specasr`
    ("__init__", "cli"),  # front ends: the lazy API, the command line
    ("apps", "eval", "recipes"),  # front ends the CLI serves
    ("model",),  # WhisperModel: faster-whisper's call shape
    ("transcription",),
    ("longform",),
    ("decode",),
    ("models",),
    ("runtime",),
    ("backends",),
    ("kernels",),
    ("audio", "features", "tokenizer", "writers"),
    ("results",),
    ("options", "stats", "cache"),
    ("constants",),
)


def _package(module: str) -> str:
    """specasr.decode.loop -> decode; specasr.kernels -> kernels; specasr -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _every_import(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules `name` imports anywhere in its file, inside functions and
    TYPE_CHECKING blocks too: a package's dependencies, not only its load-time ones."""
    package = _package_of_file(name, path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        found.update(_imported(node, package, known))
    return _project_modules(found, known)


def _back_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) module pairs whose packages are not in a strictly lower layer."""
    rank = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
    bad = []
    for mod, deps in graph.items():
        src = _package(mod)
        for dep in deps:
            dst = _package(dep)
            if dst != src and not rank.get(src, -1) < rank.get(dst, -1):
                bad.append((mod, dep))
    return sorted(bad)


def test_dependencies_point_one_way_between_packages():
    modules = _modules()
    graph = {name: _every_import(name, path, set(modules)) for name, path in modules.items()}
    unknown = sorted({_package(m) for m in modules} - {p for layer in LAYERS for p in layer})
    assert unknown == [], f"packages in no layer of LAYERS: {unknown}"
    assert "specasr.runtime.forms" in graph["specasr.runtime.runner"]  # the parser sees real imports
    assert _back_edges(graph) == []


def test_the_layer_check_finds_a_back_edge():
    graph = {
        "specasr.decode.loop": {"specasr.runtime.runner", "specasr.stats"},  # downward: fine
        "specasr.backends.cpu.linear": {"specasr.models.whisper"},  # a backend importing a model
        "specasr.apps.service": {"specasr.eval.runner"},  # two front ends of one layer
    }
    assert _back_edges(graph) == [
        ("specasr.apps.service", "specasr.eval.runner"),
        ("specasr.backends.cpu.linear", "specasr.models.whisper"),
    ]


def test_top_level_api_is_lazy():
    """`import specasr` loads neither torch nor transformers; the names resolve on use."""
    probe = (
        "import sys, specasr\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
        "from specasr import DecodeOptions, TranscribeOptions, load_pair, transcribe, transcribe_clip\n"
        "print(DecodeOptions.__module__, load_pair.__module__, transcribe.__module__, callable(transcribe))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        "False",
        "False",
        "specasr.options",
        "specasr.models.loading",
        "specasr.transcription",
        "True",
    ]


def test_a_cpu_verify_never_imports_triton():
    """Triton costs about 0.3 s and 70 MB resident at import; CPU runs load the whole
    decoding stack and run every verifier mode without it, and the CUDA path still finds it."""
    probe = (
        "import sys, torch\n"
        "import specasr.transcription, specasr.decode.loop\n"
        "from specasr import kernels\n"
        "t = torch.randn(1, 3, 11); d = torch.randn(1, 2, 11); tok = torch.tensor([[1, 2]])\n"
        "u = torch.rand(1, 2); e = torch.ones(1, 11)\n"
        "for mode in kernels.MODES:\n"
        "    for T in (0.0, 1.0):\n"
        "        kernels.verify(t, d, tok, u, e, temperature=T, mode=mode)\n"
        "print('triton' in sys.modules)\n"
        "from specasr.kernels import exact_triton\n"
        "print('triton' in sys.modules, exact_triton.HAS_TRITON == kernels.HAS_TRITON)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    lines = out.stdout.split("\n")
    assert lines[0] == "False"
    assert lines[1] == f"{kernels_has_triton()} True"


def kernels_has_triton() -> bool:
    from specasr.kernels._common import HAS_TRITON

    return HAS_TRITON
