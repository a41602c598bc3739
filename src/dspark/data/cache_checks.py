"""Where a feature cache's manifest and index may point (artifact paths stay inside).

A cache is read through names and offsets its own files hold, so a damaged or hostile
manifest could name a file outside the folder (``/etc/passwd``, ``../other/shard``) and
an index could point past the end of a shard. Both are refused when the cache is opened,
before anything is mapped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SHARD_NAME = re.compile(r"^shard-\d{5}-\d{5}\.bin$")


def check_shard_entries(root: Path, shards: Any, error: type[Exception]) -> None:
    """Every shard entry is ``{"file": "shard-RRRRR-KKKKK.bin", "bytes": int >= 0, ...}`` inside ``root``."""
    if not isinstance(shards, list):
        raise error(f"{root}: corrupt manifest (shards is not a list)")
    for entry in shards:
        name = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not SHARD_NAME.match(name):
            raise error(f"{root}: corrupt manifest: shard file {name!r} is not a shard name inside the cache")
        if (root / name).resolve().parent != root.resolve():
            raise error(f"{root}: corrupt manifest: shard file {name!r} resolves outside the cache")
        size = entry.get("bytes")
        if (
            not isinstance(size, int)
            or isinstance(size, bool)
            or size < 0
            or not isinstance(entry.get("sha256"), str)
        ):
            raise error(f"{root}: corrupt manifest: shard {name} has no valid byte count or sha256")


def check_index(
    root: Path, index: np.ndarray, shard_bytes: Sequence[int], sample_size: Callable[[int], int], error
) -> None:
    """Every index row ``(shard, offset, tokens)`` names a shard and a region inside it."""
    if index.size == 0:
        return
    shard, offset, tokens = index[:, 0], index[:, 1], index[:, 2]  # [N] each
    if (shard < 0).any() or (shard >= len(shard_bytes)).any():
        raise error(f"{root}: corrupt index: a sample names a shard the manifest does not list")
    if (offset < 0).any() or (tokens < 1).any():
        raise error(f"{root}: corrupt index: a negative offset or an empty sample")
    sizes = {int(t): sample_size(int(t)) for t in np.unique(tokens)}
    ends = offset + np.vectorize(sizes.__getitem__, otypes=[np.int64])(tokens)  # [N]
    limits = np.asarray(shard_bytes, dtype=np.int64)[shard]  # [N]
    bad = np.flatnonzero(ends > limits)
    if bad.size:
        raise error(f"{root}: corrupt index: sample {int(bad[0])} reaches past the end of its shard")
