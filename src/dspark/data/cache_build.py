"""Building the offline feature cache, on one process or many under torchrun (DESIGN §7.3).

Every rank tokenizes all records the way training does
(:func:`dspark.data.samples.tokenize_records`: same chat template, kwargs, loss mask,
truncation), so sample ``i`` means the same thing everywhere. Rank ``r`` of ``W`` runs
the target over samples ``r, r + W, ...`` one at a time (batch 1: a sample's features
never depend on what it was batched with, so a cache is the same whatever the number of
processes) and streams them into its own shards, hashing as it writes. Rank 0 then
gathers the shard lists, writes the index in sample order and the manifest, each
through a temporary file and a rename: a cache without ``manifest.json`` is unfinished.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dspark.data.cache import (
    FORMAT,
    INDEX,
    MANIFEST,
    VERSION,
    encode_sample,
    target_identity,
    template_identity,
)
from dspark.data.estimate import CacheEstimate, check_disk, estimate_cache
from dspark.data.samples import tokenize_records
from dspark.durable import write_atomic
from dspark.errors import DsparkError

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class CacheBuildConfig:
    dtype: str = "bf16"  # fp32 | bf16 | fp16 | fp8
    max_length: int = 1024  # tokens per sample, as in training (`dspark train --max-length`)
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    shard_bytes: int = 1 << 30  # a shard is closed once it holds this much
    check_disk: bool = True
    overwrite: bool = False
    progress: bool = True


def _write_atomic(path: Path, data: bytes) -> None:
    """Readers see all of ``path`` or none (:func:`~dspark.durable.write_atomic`)."""
    write_atomic(path, data, tmp=path.with_name(path.name + ".tmp"))


class ShardWriter:
    """Streams samples into ``shard-RRRRR-KKKKK.bin`` files of about ``shard_bytes`` each."""

    def __init__(self, root: Path, rank: int, shard_bytes: int) -> None:
        self.root, self.rank, self.shard_bytes = root, rank, shard_bytes
        self.shards: list[dict[str, Any]] = []  # closed shards' metadata (file, bytes, sha256, ...)
        self.placements: list[tuple[int, str, int, int]] = []  # (sample, shard file, offset, tokens)
        self._file = None

    def _open(self) -> None:
        name = f"shard-{self.rank:05d}-{len(self.shards):05d}.bin"
        self._name, self._path = name, self.root / name
        self._file = open(self._path.with_name(name + ".tmp"), "wb")  # noqa: SIM115 (closed in close())
        self._hash, self._bytes, self._samples, self._tokens = hashlib.sha256(), 0, 0, 0

    def add(self, sample: int, data: bytes, tokens: int) -> None:
        if self._file is None:
            self._open()
        self.placements.append((sample, self._name, self._bytes, tokens))
        self._file.write(data)
        self._hash.update(data)
        self._bytes += len(data)
        self._samples += 1
        self._tokens += tokens
        if self._bytes >= self.shard_bytes:
            self.close()

    def close(self) -> None:
        if self._file is None:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._path.with_name(self._name + ".tmp"), self._path)
        self.shards.append(
            {
                "file": self._name,
                "bytes": self._bytes,
                "sha256": self._hash.hexdigest(),
                "num_samples": self._samples,
                "num_tokens": self._tokens,
                "rank": self.rank,
            }
        )
        self._file = None


def prepare_folder(root: Path, overwrite: bool) -> None:
    """Refuse a folder that holds files a cache build does not write (the user's: a build next to
    them would leave a folder of both), before :func:`clear_folder` removes a cache's by name."""
    if (root / MANIFEST).exists() and not overwrite:
        raise DsparkError(f"{root} already holds a feature cache; pass --overwrite to replace it")
    ours = (MANIFEST, f"{MANIFEST}.tmp", f"{INDEX}*", "shard-*.bin*")
    foreign = (
        sorted(p.name for p in root.iterdir() if not any(p.match(n) for n in ours)) if root.is_dir() else []
    )
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise DsparkError(
            f"{root} holds files that are not a feature cache's ({shown}); give an empty or new folder, "
            "or the folder of a cache to replace"
        )
    root.mkdir(parents=True, exist_ok=True)


def clear_folder(root: Path) -> None:
    """Remove the files of an earlier or interrupted build (manifest first: the cache is gone)."""
    (root / MANIFEST).unlink(missing_ok=True)
    for path in root.glob("shard-*.bin*"):
        path.unlink()
    for name in (INDEX, INDEX + ".tmp", MANIFEST + ".tmp"):
        (root / name).unlink(missing_ok=True)


def merge_shards(
    root: Path, parts: list[dict[str, Any]], num_samples: int, header: dict[str, Any]
) -> dict[str, Any]:
    """Rank 0: one shard list, the index in sample order, the manifest (written last)."""
    shards = sorted((s for p in parts for s in p["shards"]), key=lambda s: s["file"])
    shard_id = {s["file"]: i for i, s in enumerate(shards)}
    index = np.full((num_samples, 3), -1, dtype="<i8")  # [N, 3]: shard, byte offset, tokens
    for part in parts:
        for sample, file, offset, tokens in part["placements"]:
            index[sample] = (shard_id[file], offset, tokens)
    missing = np.flatnonzero(index[:, 0] < 0)
    if missing.size:
        raise DsparkError(f"cache build lost {missing.size} samples (first: {missing[0]})")
    index_bytes = index.tobytes()
    _write_atomic(root / INDEX, index_bytes)
    manifest = header | {
        "index": {
            "file": INDEX,
            "bytes": len(index_bytes),
            "sha256": hashlib.sha256(index_bytes).hexdigest(),
        },
        "shards": shards,
    }
    _write_atomic(root / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    return manifest


@dataclass
class CacheJob:
    """What a build writes: the records tokenized as training does, their lengths, the estimate."""

    records: list[Mapping[str, Any]]
    dataset: Any  # dspark.data.samples.TokenizedDataset
    lengths: list[int]
    estimate: CacheEstimate
    config: CacheBuildConfig

    @classmethod
    def prepare(
        cls,
        target,
        records: Iterable[Mapping[str, Any]],
        root: Path,
        config: CacheBuildConfig,
        *,
        show: bool = True,
        announce: Callable[[CacheEstimate], None] | None = None,
    ) -> CacheJob:
        """Tokenize, estimate the size (to ``announce`` when ``show``) and check the disk."""

        records = list(records)
        dataset = tokenize_records(
            records, target.tokenizer, max_length=config.max_length, template_kwargs=config.template_kwargs
        )
        lengths = [s.input_ids.numel() for s in dataset]
        layers = len(target.target_layer_ids)
        estimate = estimate_cache(target.hidden_size, layers, config.dtype, sum(lengths))
        if show:
            log.info("feature cache estimate: %s", estimate.describe().replace("\n", "; "))
            if announce is not None:
                announce(estimate)
        if config.check_disk:
            check_disk(root, estimate.total_bytes)
        return cls(records, dataset, lengths, estimate, config)

    def write(self, target, samples: Iterable[int], writer: ShardWriter, bar) -> None:
        """Run the target over ``samples`` one at a time (batch 1) into ``writer``; closes it."""
        for i in samples:
            sample = self.dataset[i]
            ids = sample.input_ids[None].to(target.device)
            out = target.forward(ids, target.new_cache(), with_features=True)
            data = encode_sample(
                sample.input_ids, sample.loss_mask, out.features[0], out.hidden[0], self.config.dtype
            )
            writer.add(i, data, self.lengths[i])
            bar.update(self.lengths[i])
        writer.close()

    def records_sha256(self) -> str:
        text = json.dumps(self.records, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def header(self, target, source: str, *, world_size: int, seconds: float) -> dict[str, Any]:
        """The manifest without its index and shards."""
        config = self.config
        return {
            "format": FORMAT,
            "version": VERSION,
            "dtype": config.dtype,
            "target": target_identity(target),
            "template": template_identity(target.tokenizer, config.template_kwargs, config.max_length),
            "data": {
                "source": source,
                "records_sha256": self.records_sha256(),
                "num_samples": len(self.dataset),
                "num_tokens": sum(self.lengths),
                "num_supervised_tokens": int(sum(int(s.loss_mask.sum()) for s in self.dataset)),
                "fingerprint": self.dataset.fingerprint,
            },
            "pad_token_id": target.tokenizer.pad_token_id,
            "estimate": self.estimate.as_dict(),
            "world_size": world_size,
            "build_seconds": round(seconds, 3),
        }
