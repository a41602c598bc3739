"""Feature-cache artifact paths stay inside the cache folder; index offsets inside their shard
(issue 15, finding 10). The checkpoint ``latest`` pointer: test_checkpoint_integrity.py."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from dspark.data.cache import CacheError, FeatureCache
from dspark.data.cache_build import CacheBuildConfig
from dspark.targets import TargetAdapter
from dspark.training.feature_cache import build_cache
from tests.unit.data.tiny_chat_target import build_tiny_chat_target


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    target = TargetAdapter.from_pretrained(build_tiny_chat_target(root / "target"))
    records = [{"turns": [f"Explain {i}."], "answers": ["The quick brown fox jumps."]} for i in range(4)]
    build_cache(
        target, records, root / "c", CacheBuildConfig(dtype="fp32", shard_bytes=20_000, progress=False)
    )
    return root / "c"


def _copy(cache, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(cache, root)
    return root, json.loads((root / "manifest.json").read_text())


def _write_manifest(root, manifest) -> None:
    (root / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("where", ["parent", "absolute"])
def test_a_shard_entry_outside_the_cache_is_refused(cache, tmp_path, where):
    root, manifest = _copy(cache, tmp_path)
    shard = manifest["shards"][0]["file"]
    outside = tmp_path / "outside.bin"  # same bytes and sha256: only the path is wrong
    shutil.copyfile(root / shard, outside)
    (root / shard).unlink()
    manifest["shards"][0]["file"] = "../outside.bin" if where == "parent" else str(outside)
    _write_manifest(root, manifest)
    with pytest.raises(CacheError, match="not a shard name inside the cache"):
        FeatureCache.open(root)


def test_index_offsets_past_a_shard_are_refused(cache, tmp_path):
    root, manifest = _copy(cache, tmp_path)
    index = np.fromfile(root / "index.bin", dtype="<i8").reshape(-1, 3)
    index[-1, 1] = manifest["shards"][int(index[-1, 0])]["bytes"]  # starts at the shard's end
    data = index.tobytes()
    (root / "index.bin").write_bytes(data)
    manifest["index"] |= {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _write_manifest(root, manifest)
    with pytest.raises(CacheError, match="reaches past the end of its shard"):
        FeatureCache.open(root)
    index[-1] = (len(manifest["shards"]), 0, 5)  # a shard that does not exist
    data = index.tobytes()
    (root / "index.bin").write_bytes(data)
    manifest["index"] |= {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _write_manifest(root, manifest)
    with pytest.raises(CacheError, match="names a shard the manifest does not list"):
        FeatureCache.open(root)


def test_an_intact_cache_opens_and_reads(cache):
    opened = FeatureCache.open(cache)
    assert len(opened) == 4 and opened.sample(3).input_ids.numel() > 0
