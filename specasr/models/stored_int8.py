"""Int8 forms quantised once and read from the cache at later loads.

Quantising is a load's largest cost after reading the weights. A distilled draft's products
and head (the target's embedding rows for the draft's vocabulary) become int8 rows with one
scale per row (`DistilledDraft.quantize_int8`; the fused C step also reads each row's sum). An
int8 target's (`compute_type="int8"`) become per-row int8 rows too: the decoder's products,
the head in the compiled library's 16-row blocks, and the once-per-window products
(`specasr.models.whisper.quantize_target`, `quantize_window`). These depend only on the weights
and the quantiser, so the first load stores them (a safetensors file under
`default_cache_root()/int8`) and every later load reads them instead of quantising again
(measured: docs/benchmarks.md, "Start-up").

An entry's key covers the target's weights files (resolved path, size and mtime: the conversion
cache's directories and the hub's blobs are named by their content), for a draft the draft
file's bytes (sha256, memoised by path, size and mtime as the conversion cache's file hashes
are), and `VERSION`. An entry is written whole (`specasr.cache.store`); one that cannot be
read is quantised again, and a cache that cannot be written costs only that.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from specasr.cache import default_cache_root, store

# bump when a quantiser (`specasr.backends.cpu.linear._quantize_rows`), the library's layout
# (`specasr.backends.cpu.fused.Int8Rows`), the set of products or their names change: older
# entries are then never read
VERSION = 1
HEAD = "head"  # the entry's name for the head; the products go by their module paths

Forms = dict[str, dict[str, Tensor]]  # product name -> its tensors by field


@dataclass(frozen=True)
class Rows:
    """One product as int8 rows: W ≈ q · scale, per output row."""

    q: Tensor  # [out, in] int8
    scale: Tensor  # [out] fp64
    sums: Tensor  # [out] int32, the rows' sums (for the C step's +128 shift of its inputs)
    bias: Tensor | None  # [out] fp32

    def fields(self) -> dict[str, Tensor]:
        bias = {} if self.bias is None else {"bias": self.bias}
        return {"q": self.q, "scale": self.scale, "sums": self.sums, **bias}

    @classmethod
    def of(cls, fields: dict[str, Tensor]) -> Rows:
        return cls(fields["q"], fields["scale"], fields["sums"], fields.get("bias"))


def _weights_files(target_dir: Path) -> list[Path]:
    found = sorted(target_dir.glob("model*.safetensors"))
    return found or [p for p in (target_dir / "pytorch_model.bin",) if p.is_file()]


def _target_identity(target_dir: str | Path | None) -> str | None:
    """The target's weights files as "resolved path|size|mtime_ns;…", or None where unknown."""
    if target_dir is None:
        return None
    files = _weights_files(Path(target_dir))
    if not files:
        return None
    stats = [(p.resolve(), p.stat()) for p in files]
    return ";".join(f"{p}|{st.st_size}|{st.st_mtime_ns}" for p, st in stats)


class StoredInt8:
    """One cache entry of int8 forms: a draft's for one target (`for_draft`) or an int8
    target's (`for_target`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def _keyed(cls, kind: str, parts: list[str], root: Path | None) -> StoredInt8:
        key = hashlib.sha256("\n".join([f"v{VERSION}", kind, *parts]).encode()).hexdigest()[:32]
        return cls((root or default_cache_root()) / "int8" / f"{kind}-{key}.safetensors")

    @classmethod
    def for_draft(
        cls, draft_file: str | Path, target_dir: str | Path | None, root: Path | None = None
    ) -> StoredInt8 | None:
        """The entry for `draft_file` bound to the target read from `target_dir`, or None where the
        target's weights files are not known (a model built in memory) or not found."""
        from specasr.models.convert import file_digests

        target = _target_identity(target_dir)
        if target is None:
            return None
        (digest,) = file_digests([(Path(draft_file),)], root or default_cache_root())
        return cls._keyed("draft", [digest, target], root)

    @classmethod
    def for_target(cls, target_dir: str | Path | None, root: Path | None = None) -> StoredInt8 | None:
        """The entry for the int8 forms of the target read from `target_dir` (None as `for_draft`)."""
        target = _target_identity(target_dir)
        return None if target is None else cls._keyed("target", [target], root)

    def read(self) -> Forms | None:
        """name -> field -> tensor, or None where the entry is missing or unreadable."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        if not self.path.is_file():
            return None
        try:
            tensors = load_file(str(self.path))
        except (OSError, RuntimeError, ValueError, SafetensorError):  # torn by hand, another format
            return None
        forms: Forms = {}
        for key, t in tensors.items():
            name, field = key.rsplit(".", 1)
            forms.setdefault(name, {})[field] = t
        return forms

    def write(self, forms: Forms) -> bool:
        """Stores `forms` whole; False where the cache cannot be written (nothing else fails)."""
        from safetensors.torch import save

        tensors = {f"{name}.{field}": t.contiguous() for name, fs in forms.items() for field, t in fs.items()}
        data = save(tensors, metadata={"version": str(VERSION)})
        try:
            store(self.path, data)
        except OSError:
            return False
        return True


class Int8State:
    """A load's int8 forms by name: those read from an entry (`get`) and those it quantised
    afresh (`put`: a form missing from the entry, or one whose stored tensors did not fit),
    which `save` writes into the entry."""

    def __init__(self, entry: StoredInt8 | None) -> None:
        self.entry = entry
        self.stored: Forms = (entry.read() if entry is not None else None) or {}
        self.made: Forms = {}

    def get(self, name: str) -> dict[str, Tensor] | None:
        return self.stored.get(name)

    def put(self, name: str, fields: dict[str, Tensor]) -> None:
        self.made[name] = fields

    def save(self) -> bool:
        """Writes the entry again where this load quantised anything; True if it wrote."""
        if self.entry is None or not self.made:
            return False
        return self.entry.write(self.stored | self.made)
