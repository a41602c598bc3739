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
    """Raise :class:`CheckpointError` unless every file of ``folder`` is there with the sha256
    its marker records.

    A marker without checksums (hand-edited, or from a dspark before checksums) cannot
    vouch for the bytes: such a checkpoint is refused too, as a corrupt one is, rather than
    resumed unverified. So is a file the marker does not vouch for (the loader reads every file).
    """
    try:
        marker = json.loads((folder / MARKER).read_text())
        files = {str(f) for f in marker["files"]}
        sums = marker.get("sha256")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{folder}: unreadable {MARKER} marker ({e})") from None
    if not isinstance(sums, dict):
        raise CheckpointError(
            f"{folder}: its {MARKER} marker records no sha256 checksums, so its files cannot be verified"
        )
    for name in sorted((files | {p.name for p in folder.iterdir()}) - {MARKER}):
        path = folder / name
        if Path(name).name != name or not path.is_file():
            raise CheckpointError(f"{folder}: {name} is missing")
        if file_sha256(path) != sums.get(name):
            raise CheckpointError(f"{path} is corrupt: its sha256 differs from the one saved with it")
