"""Files that cross to and from the GPU machine in pieces: split, join, digests.

Imported by plan.py, run.py and collect.py (not run by hand).

A device call carries 64 MiB at most and brings back at most 8 files of 16 MiB: the pinned
SmolLM2 GGUF (98 MB) goes over in parts, and the trained drafters come back as shards of a
tar. Every piece is named in a manifest with its sha256 and size, so the side that joins
them checks each piece and the whole before using it.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path

MIB = 2**20


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@dataclass(frozen=True, kw_only=True)
class Piece:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class Split:
    """One file cut into pieces ``<name>.part-NN``, in order."""

    name: str
    size: int
    sha256: str
    pieces: tuple[Piece, ...]

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> Split:
        return cls(
            name=raw["name"],
            size=raw["size"],
            sha256=raw["sha256"],
            pieces=tuple(Piece(**p) for p in raw["pieces"]),
        )


def split_sizes(total: int, rooms: list[int]) -> list[int]:
    """The byte counts of the pieces of a ``total``-byte file, the i-th at most ``rooms[i]``
    (the room left in the i-th call); as few pieces as fit, each as full as its room.
    Raises ValueError when the rooms together are too small."""
    sizes, left = [], total
    for room in rooms:
        if left <= 0:
            break
        take = min(left, max(room, 0))
        if take:
            sizes.append(take)
            left -= take
    if left > 0:
        raise ValueError(f"{total} bytes do not fit rooms of {sum(max(r, 0) for r in rooms)} bytes")
    return sizes


def split_file(path: Path, sizes: list[int], out: Path, *, name: str | None = None) -> Split:
    """Cut ``path`` into ``out/<name>.part-NN`` of ``sizes`` bytes (which sum to its size)."""
    name = name or path.name
    total = path.stat().st_size
    assert sum(sizes) == total, f"piece sizes {sum(sizes)} != file size {total}"
    out.mkdir(parents=True, exist_ok=True)
    pieces = []
    with open(path, "rb") as f:
        for i, size in enumerate(sizes):
            piece = out / f"{name}.part-{i:02d}"
            piece.write_bytes(f.read(size))
            pieces.append(Piece(name=piece.name, size=size, sha256=sha256(piece)))
    return Split(name=name, size=total, sha256=sha256(path), pieces=tuple(pieces))


def missing_pieces(split: Split, folder: Path) -> list[str]:
    """The pieces of ``split`` not (yet) in ``folder`` with their recorded size."""
    return [
        p.name
        for p in split.pieces
        if not (folder / p.name).is_file() or (folder / p.name).stat().st_size != p.size
    ]


def join_file(split: Split, folder: Path, out: Path) -> Path:
    """Join the pieces in ``folder`` into ``out`` and check each piece's and the whole's sha256.

    Raises ValueError naming the first piece missing or corrupt, or a wrong whole."""
    missing = missing_pieces(split, folder)
    if missing:
        raise ValueError(f"{split.name}: pieces missing: {', '.join(missing)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".joining")
    with open(tmp, "wb") as w:
        for p in split.pieces:
            data = (folder / p.name).read_bytes()
            if hashlib.sha256(data).hexdigest() != p.sha256:
                raise ValueError(f"{split.name}: piece {p.name} has the wrong sha256")
            w.write(data)
    digest = sha256(tmp)
    if digest != split.sha256:
        tmp.unlink()
        raise ValueError(f"{split.name}: joined sha256 {digest}, expected {split.sha256}")
    tmp.replace(out)
    return out


def tar_folders(folders: dict[str, Path], out: Path) -> Path:
    """An uncompressed tar of ``folders`` (arcname -> folder): weights do not compress."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:
        for arcname, folder in sorted(folders.items()):
            tar.add(folder, arcname=arcname)
    return out


def shard(path: Path, out: Path, *, shard_bytes: int) -> Split:
    """``path`` cut into shards of at most ``shard_bytes`` (the files a call brings back)."""
    total = path.stat().st_size
    sizes = [min(shard_bytes, total - i) for i in range(0, total, shard_bytes)] or [0]
    return split_file(path, sizes, out)


def extract_tar(path: Path, dest: Path) -> list[str]:
    """Extract a tar made by :func:`tar_folders` (members must stay inside ``dest``)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path) as tar:
        tar.extractall(dest, filter="data")
        return sorted({m.name.split("/")[0] for m in tar.getmembers()})


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` as JSON, atomically (a run killed from outside leaves the previous file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
