"""The feature cache built across ranks (DESIGN §6): each rank runs the target over its share
of the samples and writes its own shards; rank 0 merges the manifest.

The cache's format, its job and its shard writer are :mod:`dspark.data.cache_build`; what
this module adds is the split over a ``torch.distributed`` world, which lives in training.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from dspark.data.cache import MANIFEST
from dspark.data.cache_build import (
    CacheBuildConfig,
    CacheJob,
    ShardWriter,
    clear_folder,
    merge_shards,
    prepare_folder,
)
from dspark.data.estimate import CacheEstimate
from dspark.training import distributed

DEFAULT_CONFIG = CacheBuildConfig()


def build_cache(
    target,
    records: Iterable[Mapping[str, Any]],
    out_dir: str | Path,
    config: CacheBuildConfig = DEFAULT_CONFIG,
    *,
    source: str = "",
    world=None,
    announce: Callable[[CacheEstimate], None] | None = None,
) -> dict[str, Any]:
    """Build a feature cache of ``records`` (conversations or regenerated records) in ``out_dir``.

    The size estimate goes to ``announce`` (rank 0) and is checked against the free disk
    space before any forward. ``world`` (from
    :func:`dspark.training.distributed.init_from_env`) splits the work; every rank must
    call this with the same arguments. Returns the manifest (on every rank).
    """
    world = world or distributed.current_world(target.device)
    root = Path(out_dir)
    job = CacheJob.prepare(target, records, root, config, show=world.is_main, announce=announce)
    if world.is_main:
        prepare_folder(root, config.overwrite)
        clear_folder(root)
    distributed.barrier()  # nobody writes before rank 0 has cleared the folder

    started = time.perf_counter()
    writer = ShardWriter(root, world.rank, config.shard_bytes)
    mine = range(world.rank, len(job.dataset), world.world_size)
    bar = tqdm(
        total=sum(job.lengths[i] for i in mine), unit="tok", disable=not (config.progress and world.is_main)
    )
    job.write(target, mine, writer, bar)
    bar.close()

    parts = distributed.all_gather_objects({"shards": writer.shards, "placements": writer.placements})
    header = job.header(target, source, world_size=world.world_size, seconds=time.perf_counter() - started)
    manifest = merge_shards(root, parts, len(job.dataset), header) if world.is_main else None
    distributed.barrier()  # every rank returns once the manifest exists
    return manifest if manifest is not None else json.loads((root / MANIFEST).read_text())
