"""Writes that survive a crash or a power cut: the one fsync and atomic-replace helper.

A file a reader may open at any moment (a checkpoint's ``latest``, a cache manifest, a
stage marker, a report, a drafter's ``config.json``) is written to a temporary file in
the same folder, fsynced, renamed over the old one and the folder fsynced: a reader sees
the old file or the whole new one, never a part, and the rename is on disk when the
call returns. Folders written as a whole are :mod:`dspark.output_folders`' business.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_path(path: str | Path) -> None:
    """Flush ``path`` to disk: a file's bytes, or a folder's entries (a rename in it, a new file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: str | Path, data: bytes | str, *, tmp: Path | None = None, mkdir: bool = False
) -> Path:
    """Replace ``path`` by ``data`` atomically and durably (module docstring).

    ``tmp`` names the temporary file, for callers whose cleanup of an interrupted write
    looks for that name; by default it is a fresh hidden ``.<name>.*`` file beside
    ``path``. ``mkdir`` creates the parent folders first.
    """
    path = Path(path)
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    if tmp is None:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        tmp = Path(name)
    else:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # as open(tmp, "wb")
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)
    return path
