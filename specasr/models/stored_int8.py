"""A distilled draft's int8 products, quantised once and read from the cache at later loads.

`DistilledDraft.quantize_int8` turns each product of the draft, and its head (the target's
embedding rows for the draft's vocabulary), into int8 rows with one scale per row; the fused C
step also reads each row's sum. These depend only on the draft file, the target's weights and
the quantiser, so the first load stores them (a safetensors file under
`default_cache_root()/int8`) and every later load reads them instead of gathering the head rows
from the target's embedding and quantising again (measured: docs/benchmarks.md, "Start-up").

The key covers the draft file's bytes (sha256, memoised by path, size and mtime as the
conversion cache's file hashes are), the target's weights files (resolved path, size and
mtime: the conversion cache's directories and the hub's blobs are named by their content) and
`VERSION`. An entry is written whole (`specasr.cache.store`); one that cannot be read is
quantised again, and a cache that cannot be written costs only that.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from specasr.cache import default_cache_root, store

# bump when the quantiser (`specasr.backends.cpu.linear._quantize_rows`), the set of products
# or their names change: older entries are then never read
VERSION = 1
HEAD = "head"  # the entry's name for the head rows; the products go by their module paths


@dataclass(frozen=True)
class Rows:
    """One product as int8 rows: W ≈ q · scale, per output row."""

    q: Tensor  # [out, in] int8
    scale: Tensor  # [out] fp64
    sums: Tensor  # [out] int32, the rows' sums (for the C step's +128 shift of its inputs)
    bias: Tensor | None  # [out] fp32


def _weights_files(target_dir: Path) -> list[Path]:
    found = sorted(target_dir.glob("model*.safetensors"))
    return found or [p for p in (target_dir / "pytorch_model.bin",) if p.is_file()]


class StoredInt8:
    """The cache entry of one draft's int8 rows for one target (`for_draft`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_draft(
        cls, draft_file: str | Path, target_dir: str | Path | None, root: Path | None = None
    ) -> StoredInt8 | None:
        """The entry for `draft_file` bound to the target read from `target_dir`, or None where the
        target's weights files are not known (a model built in memory) or not found."""
        from specasr.models.convert import file_digests

        if target_dir is None:
            return None
        files = _weights_files(Path(target_dir))
        if not files:
            return None
        root = root or default_cache_root()
        (digest,) = file_digests([(Path(draft_file),)], root)
        stats = [(p.resolve(), p.stat()) for p in files]
        target = ";".join(f"{p}|{st.st_size}|{st.st_mtime_ns}" for p, st in stats)
        key = hashlib.sha256(f"v{VERSION}\n{digest}\n{target}".encode()).hexdigest()[:32]
        return cls(root / "int8" / f"draft-{key}.safetensors")

    def read(self) -> dict[str, Rows] | None:
        """name -> rows, or None where the entry is missing or unreadable."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        if not self.path.is_file():
            return None
        try:
            tensors = load_file(str(self.path))
        except (OSError, RuntimeError, ValueError, SafetensorError):  # torn by hand, another format
            return None
        names = {k.rsplit(".", 1)[0] for k in tensors}
        try:
            return {
                name: Rows(
                    tensors[f"{name}.q"],
                    tensors[f"{name}.scale"],
                    tensors[f"{name}.sums"],
                    tensors.get(f"{name}.bias"),
                )
                for name in names
            }
        except KeyError:
            return None

    def write(self, rows: dict[str, Rows]) -> bool:
        """Stores `rows` whole; False where the cache cannot be written (nothing else fails)."""
        from safetensors.torch import save

        tensors: dict[str, Tensor] = {}
        for name, r in rows.items():
            tensors |= {f"{name}.q": r.q, f"{name}.scale": r.scale, f"{name}.sums": r.sums}
            if r.bias is not None:
                tensors[f"{name}.bias"] = r.bias
        data = save({k: t.contiguous() for k, t in tensors.items()}, metadata={"version": str(VERSION)})
        try:
            store(self.path, data)
        except OSError:
            return False
        return True
