"""Integrity of training checkpoints: every file's sha256 in the ``COMPLETE`` marker, checked on resume.

A checkpoint that is complete (its marker exists) may still be damaged afterwards: a
flipped byte resumes silently into a worse drafter, a truncated or emptied file fails
deep inside safetensors. :func:`verify_checkpoint` tells before anything is loaded, so
that :func:`dspark.training.checkpoint.latest_checkpoint` can fall back to the newest
intact checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from safetensors import SafetensorError, safe_open

from dspark.errors import DsparkError

MARKER = "COMPLETE"


class CheckpointError(DsparkError):
    """A checkpoint is missing, incomplete, corrupt, or does not fit this run."""


def file_sha256(path: Path, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify_checkpoint(folder: Path) -> None:
    """Raise :class:`CheckpointError` unless every file the marker lists is there with its sha256.

    Markers written before checksums existed list no sha256: their safetensors headers
    and JSON files are checked to parse instead.
    """
    try:
        marker = json.loads((folder / MARKER).read_text())
        files = list(marker["files"])
        sums = marker.get("sha256")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{folder}: unreadable {MARKER} marker ({e})") from None
    for name in files:
        path = folder / name
        if name == MARKER:
            continue
        if Path(name).name != name or not path.is_file():
            raise CheckpointError(f"{folder}: {name} is missing")
        if sums is not None:
            if file_sha256(path) != sums.get(name):
                raise CheckpointError(f"{path} is corrupt: its sha256 differs from the one saved with it")
        elif name.endswith(".safetensors"):
            try:
                with safe_open(str(path), "pt") as f:
                    f.keys()
            except (SafetensorError, OSError) as e:
                raise CheckpointError(f"{path} is corrupt ({e})") from None
        elif name.endswith(".json"):
            try:
                json.loads(path.read_text())
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise CheckpointError(f"{path} is corrupt ({e})") from None
