"""A feature cache built piece by piece: resumable after a kill, shared by several processes.

:func:`~dspark.training.feature_cache.build_cache` writes a cache in one go (one process or a
torchrun world); a kill starts it over. The campaign's cache of SmolLM2 takes the better
part of an hour on one core, and any of its processes may be killed at any moment, so it
builds the same cache this way instead:

- the samples are cut into contiguous *pieces* of ``piece_samples``;
- a process claims a piece (:class:`~dspark.data.records.Claims`: an ``flock`` the kernel
  drops when the process dies), writes its shards ``shard-PPPPP-KKKKK.bin`` (``P`` the
  piece) and then ``pieces/PPPPP.json`` (its shards and placements), atomically. A piece
  with its record is done; one without is written again from its first sample;
- whoever finds every piece done writes the index and the manifest, which are the same
  format as :func:`build_cache`'s (the header says ``"pieces"``).

A kill loses at most the pieces in flight. Every process that builds the same cache in
the same folder takes the pieces nobody holds, so two processes take about half the time.
``pieces/build.json`` names the inputs; a folder holding another build's pieces is
cleared by the first process to come, and refused by any other while that one writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from dspark.data.cache import MANIFEST, target_identity, template_identity
from dspark.data.cache_build import (
    CacheBuildConfig,
    CacheJob,
    ShardWriter,
    _write_atomic,
    clear_folder,
    merge_shards,
)
from dspark.data.estimate import CacheEstimate
from dspark.data.records import Claims, WriterLock
from dspark.errors import DsparkError

PIECES = "pieces"
DEFAULT = CacheBuildConfig()


def build_cache_in_pieces(
    target,
    records: Iterable[Mapping[str, Any]],
    out_dir: str | Path,
    config: CacheBuildConfig = DEFAULT,
    *,
    source: str = "",
    piece_samples: int = 64,
    wait_for_others: bool = True,
    poll_s: float = 2.0,
    announce: Callable[[CacheEstimate], None] | None = None,
) -> dict[str, Any] | None:
    """Build (or go on building) the cache of ``records`` in ``out_dir``; its manifest.

    ``wait_for_others=False`` returns None as soon as no piece is left that another
    process is not writing (a helper); else it waits for those and returns the manifest.
    """
    if piece_samples < 1:
        raise DsparkError(f"piece_samples must be ≥ 1, got {piece_samples}")
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    job = CacheJob.prepare(target, records, root, config, announce=announce)
    count = -(-len(job.dataset) // piece_samples)
    identity = {
        "records_sha256": job.records_sha256(),
        "dtype": config.dtype,
        "target": target_identity(target),
        "template": template_identity(target.tokenizer, config.template_kwargs, config.max_length),
        "piece_samples": piece_samples,
        "shard_bytes": config.shard_bytes,
    }
    pieces = root / PIECES
    with contextlib.ExitStack() as stack:
        # One process at a time looks at build.json and then joins the writers, so every
        # other writer has already passed this check: one that is there builds these inputs,
        # or another build that must not be cleared under it. (Checked outside this lock, a
        # second process could read build.json before the first had written it.)
        with _held(root / "setup.lock"):
            lock = stack.enter_context(WriterLock(pieces, "a cache build of other records", shared=True))
            if _read_json(pieces / "build.json") != json.loads(json.dumps(identity)):
                if not lock.alone:
                    raise DsparkError(f"another process is building another cache in {root}; wait for it")
                clear_folder(root)
                shutil.rmtree(pieces, ignore_errors=True)
                shutil.rmtree(root / "claims", ignore_errors=True)
                pieces.mkdir()
                _write_atomic(pieces / "build.json", (json.dumps(identity, indent=1) + "\n").encode())
            elif (root / MANIFEST).is_file():
                return json.loads((root / MANIFEST).read_text())

        started = time.perf_counter()
        if not _write_pieces(target, job, root, count, piece_samples, wait_for_others, poll_s):
            return None
        with _held(root / "merge.lock"):  # one process writes index and manifest
            if not (root / MANIFEST).is_file():
                parts = [json.loads(_piece(root, k).read_text()) for k in range(count)]
                header = job.header(target, source, world_size=1, seconds=time.perf_counter() - started)
                merge_shards(root, parts, len(job.dataset), header | {"pieces": count})
        shutil.rmtree(root / "claims", ignore_errors=True)
        return json.loads((root / MANIFEST).read_text())


def _write_pieces(
    target, job: CacheJob, root: Path, count: int, size: int, wait_for_others: bool, poll_s: float
) -> bool:
    """Write every piece nobody else holds until all are done (True) or, not waiting, none is free."""
    claims = Claims(root / "claims")
    span = [range(k * size, min(len(job.dataset), (k + 1) * size)) for k in range(count)]
    bar = tqdm(total=sum(job.lengths), unit="tok", disable=not job.config.progress)
    try:
        while True:
            left = [k for k in range(count) if not _piece(root, k).is_file()]
            bar.update(sum(job.lengths) - sum(job.lengths[i] for k in left for i in span[k]) - bar.n)
            if not left:
                return True
            took = False
            for k in left:
                if not claims.take(str(k)):
                    continue
                if _piece(root, k).is_file():  # finished between the look and the claim
                    claims.release(str(k))
                    continue
                took = True
                for stale in root.glob(f"shard-{k:05d}-*.bin*"):  # a killed attempt's
                    stale.unlink()
                writer = ShardWriter(root, k, job.config.shard_bytes)
                job.write(target, span[k], writer, bar)
                record = {"shards": writer.shards, "placements": writer.placements}
                _write_atomic(_piece(root, k), json.dumps(record).encode())
                claims.release(str(k))
            if not took:  # every piece left is being written by another process
                if not wait_for_others:
                    return False
                time.sleep(poll_s)
    finally:
        bar.close()
        claims.close()


@contextlib.contextmanager
def _held(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``, waited for; the kernel drops it if the holder dies."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _piece(root: Path, k: int) -> Path:
    return root / PIECES / f"{k:05d}.json"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
