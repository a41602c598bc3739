"""The offline feature cache against the online path it replaces (DESIGN §7.3)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dspark.data.cache import CacheError, FeatureCache
from dspark.data.cache_build import CacheBuildConfig
from dspark.data.estimate import estimate_cache
from dspark.data.samples import ShardedSampler, TrainDataset, collate, tokenize_records
from dspark.targets import TargetAdapter
from dspark.training.feature_cache import build_cache
from dspark.training.objective import drafter_loss
from dspark.training.online import anchor_generator, target_batch
from tests.unit.data.tiny_chat_target import build_tiny_chat_target, mask_token_id

REPO = Path(__file__).resolve().parents[2]
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "step",
    "by",
    "reason",
    "answer",
    "boxed",
    "def",
    "return",
    "add",
]


def _records(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)

    def text(k: int) -> str:
        return " ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (k,), generator=g))

    records = []
    for i in range(n):
        turns = 1 + i % 2
        records.append(
            {
                "turns": [text(6 + i % 5) for _ in range(turns)],
                "answers": [text(10 + (3 * i) % 17) for _ in range(turns)],
            }
        )
    return records


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return build_tiny_chat_target(tmp_path_factory.mktemp("tiny_chat"))


@pytest.fixture(scope="module")
def target(target_dir):
    return TargetAdapter.from_pretrained(target_dir)


@pytest.fixture(scope="module")
def records():
    return _records(12)


@pytest.fixture(scope="module")
def fp32_cache(target, records, tmp_path_factory):
    root = tmp_path_factory.mktemp("cache") / "fp32"
    build_cache(target, records, root, CacheBuildConfig(dtype="fp32", shard_bytes=40_000, progress=False))
    return root


def test_round_trip_is_bit_for_bit(target, records, fp32_cache, tmp_path):
    """Cached ids/mask are the training tokenization; cached features are the target's, exactly."""
    dataset = tokenize_records(records, target.tokenizer, max_length=1024)
    bf16_root = tmp_path / "bf16"
    build_cache(target, records, bf16_root, CacheBuildConfig(dtype="bf16", progress=False))
    fp32, bf16 = FeatureCache.open(fp32_cache), FeatureCache.open(bf16_root)
    assert len(fp32.manifest["shards"]) > 1  # several shards exercised
    assert fp32.manifest["data"]["fingerprint"] == dataset.fingerprint
    assert TrainDataset(fp32.token_samples()).fingerprint == dataset.fingerprint
    for i, sample in enumerate(dataset):
        online = target.forward(sample.input_ids[None], target.new_cache(), with_features=True)
        a, b = fp32.sample(i), bf16.sample(i)
        assert torch.equal(a.input_ids, sample.input_ids) and torch.equal(a.loss_mask, sample.loss_mask)
        assert a.features.dtype == torch.float32 and torch.equal(a.features, online.features[0])
        assert torch.equal(a.hidden, online.hidden[0])
        assert b.features.dtype == torch.bfloat16
        assert torch.equal(b.features, online.features[0].bfloat16())
        assert torch.equal(b.hidden, online.hidden[0].bfloat16())


def test_fp8_error_is_bounded_per_vector(target, records, tmp_path):
    build_cache(target, records[:4], tmp_path / "fp8", CacheBuildConfig(dtype="fp8", progress=False))
    cache = FeatureCache.open(tmp_path / "fp8")
    for i in range(len(cache)):
        s = cache.sample(i, torch.float32)
        online = target.forward(s.input_ids[None], target.new_cache(), with_features=True)
        for got, want in ((s.features, online.features[0]), (s.hidden, online.hidden[0])):
            amax = want.abs().amax(-1, keepdim=True)
            # e4m3: 3 mantissa bits -> relative rounding error <= 2^-4 of the scaled value.
            assert ((got - want).abs() <= amax / 16 + 1e-6).all()
            assert (got - want).abs().mean() < 0.02 * amax.mean()


def test_flipped_byte_and_truncation_are_detected(fp32_cache, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(fp32_cache, root)
    shard = root / json.loads((root / "manifest.json").read_text())["shards"][1]["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(CacheError, match=rf"{shard.name} is corrupt"):
        FeatureCache.open(root)
    FeatureCache.open(root, verify=False)  # sizes only: opens

    shard.write_bytes(bytes(data[:-1]))
    with pytest.raises(CacheError, match="bytes, the manifest says"):
        FeatureCache.open(root, verify=False)
    (root / "manifest.json").write_text('{"format": "dspark-feature-cache", "version": 1}')
    with pytest.raises(CacheError, match="corrupt manifest"):
        FeatureCache.open(root)
    (root / "manifest.json").unlink()
    with pytest.raises(CacheError, match="no feature cache"):
        FeatureCache.open(root)


def test_cache_of_another_target_or_template_is_refused(target_dir, target, fp32_cache, tmp_path):
    cache = FeatureCache.open(fp32_cache)
    cache.check_compatible(target, template_kwargs={}, max_length=1024)
    # The same checkpoint in another dtype is the same target.
    cache.check_compatible(TargetAdapter.from_pretrained(target_dir, dtype=torch.bfloat16))

    other = TargetAdapter.from_pretrained(build_tiny_chat_target(tmp_path / "other", seed=1))
    with pytest.raises(CacheError, match="weights_probe_sha256"):
        cache.check_compatible(other)
    wider = TargetAdapter.from_pretrained(build_tiny_chat_target(tmp_path / "wide", hidden_size=96))
    with pytest.raises(CacheError, match="target.hidden_size: cache 64, now 96"):
        cache.check_compatible(wider)
    layers = TargetAdapter.from_pretrained(target_dir, target_layer_ids=[0, 2])
    with pytest.raises(CacheError, match=r"target.layer_ids: cache \[0, 1, 2\], now \[0, 2\]"):
        cache.check_compatible(layers)
    with pytest.raises(CacheError, match="template.template_kwargs"):
        cache.check_compatible(target, template_kwargs={"enable_thinking": False})
    with pytest.raises(CacheError, match="template.max_length"):
        cache.check_compatible(target, max_length=512)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16", "fp8"])
def test_estimator_matches_the_real_size(target, records, tmp_path, dtype):
    manifest = build_cache(target, records, tmp_path / dtype, CacheBuildConfig(dtype=dtype, progress=False))
    real = sum(f.stat().st_size for f in (tmp_path / dtype).iterdir())  # shards, index and manifest
    estimate = estimate_cache(
        target.hidden_size, len(target.target_layer_ids), dtype, manifest["data"]["num_tokens"]
    )
    assert abs(real - estimate.total_bytes) <= 0.01 * estimate.total_bytes, (real, estimate.total_bytes)


def test_disk_check_refuses_before_any_work(target, records, tmp_path, monkeypatch):
    import shutil as shutil_module

    from dspark.errors import DsparkError

    monkeypatch.setattr(
        shutil_module, "disk_usage", lambda path: shutil_module._ntuple_diskusage(10**9, 10**9, 1000)
    )
    with pytest.raises(DsparkError, match="free"):
        build_cache(target, records, tmp_path / "c", CacheBuildConfig(progress=False))
    assert not (tmp_path / "c").exists()


def test_training_from_cache_equals_online(target, records, fp32_cache):
    """Same seed, same samples, same anchors: the first steps' losses agree (fp32 cache)."""
    from dspark.drafters.dspark import DSparkDrafter
    from dspark.presets.drafters import dspark_debug

    dataset = tokenize_records(records, target.tokenizer, max_length=1024)
    cache = FeatureCache.open(fp32_cache)
    cache.check_compatible(target, template_kwargs={}, max_length=1024)
    pad = target.tokenizer.pad_token_id

    def run(from_cache: bool) -> list[float]:
        torch.manual_seed(0)
        drafter = DSparkDrafter.from_target(target, dspark_debug(mask_token_id(target.tokenizer)))
        opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-3)
        sampler = ShardedSampler(len(dataset), global_batch=4, micro_batch=2, rank=0, world_size=1, seed=0)
        losses = []
        for step in range(1, 4):
            total = 0.0
            for mb in sampler.next_step():
                gen = anchor_generator(0, step, mb.chunk)
                if from_cache:
                    batch = cache.target_batch(mb.indices, pad_id=pad, num_anchors=6, generator=gen)
                else:
                    tb = collate([dataset[j] for j in mb.indices], pad)
                    batch = target_batch(target, tb.input_ids, tb.loss_mask, num_anchors=6, generator=gen)
                loss = drafter_loss(drafter.config, drafter.forward_train(batch)).loss / 2
                loss.backward()
                total += float(loss.detach())
            opt.step()
            opt.zero_grad()
            losses.append(total)
        return losses

    online, cached = run(False), run(True)
    assert online == pytest.approx(cached, rel=1e-5, abs=1e-6)
    assert online[0] != online[-1]  # the drafter did train


def test_two_processes_build_the_same_cache(target_dir, records, fp32_cache, tmp_path):
    """torchrun with 2 CPU ranks: each writes its own shards, rank 0 merges; same samples, same bytes."""
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "two"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "dspark",
        "data",
        "cache",
        "--data",
        str(data),
        "--out",
        str(out),
        "--target",
        str(target_dir),
        "--dtype",
        "fp32",
        "--shard-size",
        "40KB",
        "--threads",
        "1",
        "--no-progress",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = FeatureCache.open(fp32_cache), FeatureCache.open(out)
    assert two.manifest["world_size"] == 2
    assert {s["rank"] for s in two.manifest["shards"]} == {0, 1}
    assert two.manifest["data"] == one.manifest["data"] | {"source": str(data)}
    for i in range(len(one)):
        a, b = one.sample(i), two.sample(i)
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.features, b.features)
        assert torch.equal(a.hidden, b.hidden)


def test_train_cli_uses_a_matching_cache_and_refuses_another(
    target_dir, records, fp32_cache, tmp_path, capsys
):
    """`dspark train --feature-cache` trains from the cache; a cache of other records is refused."""
    from dspark.cli import main

    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    common = ["train", "--drafter", "dflash", "--target", str(target_dir), "--max-length", "1024"]
    common += ["--steps", "2", "--batch-size", "2", "--micro-batch-size", "2", "--num-anchors", "4"]
    assert (
        main([*common, "--data", str(data), "--feature-cache", str(fp32_cache), "--out", str(tmp_path / "a")])
        == 0
    )
    assert (tmp_path / "a" / "drafter" / "model.safetensors").is_file()

    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("".join(json.dumps(r) + "\n" for r in records[:6]))
    with pytest.raises(SystemExit) as e:
        main(
            [*common, "--data", str(fewer), "--feature-cache", str(fp32_cache), "--out", str(tmp_path / "b")]
        )
    assert e.value.code == 2
    assert "built from other data" in capsys.readouterr().err


# -- built piece by piece (the campaign's cache): resumable, shared ---------------------------------


class _Counting:
    """The target, counting its forwards; raises (a kill) after ``crash_after`` of them."""

    def __init__(self, target, crash_after=None):
        self._target, self.calls, self.crash_after = target, 0, crash_after

    def __getattr__(self, name):
        return getattr(self._target, name)

    def forward(self, *args, **kwargs):
        if self.crash_after is not None and self.calls >= self.crash_after:
            raise KeyboardInterrupt
        self.calls += 1
        return self._target.forward(*args, **kwargs)


FP32 = CacheBuildConfig(dtype="fp32", progress=False, check_disk=False)


def _same_samples(a_root, b_root):
    a, b = FeatureCache.open(a_root), FeatureCache.open(b_root)
    assert a.manifest["data"] == b.manifest["data"]
    for i in range(len(a)):
        x, y = a.sample(i), b.sample(i)
        assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.features, y.features)
        assert torch.equal(x.hidden, y.hidden) and torch.equal(x.loss_mask, y.loss_mask)


def test_pieces_build_the_same_cache_and_resume_after_a_kill(target, records, fp32_cache, tmp_path):
    from dspark.data.cache_pieces import build_cache_in_pieces

    root = tmp_path / "pieces"
    crashing = _Counting(target, crash_after=7)  # killed in the second piece of 5 samples
    with pytest.raises(KeyboardInterrupt):
        build_cache_in_pieces(crashing, records, root, FP32, piece_samples=5)
    resumed = _Counting(target)
    manifest = build_cache_in_pieces(resumed, records, root, FP32, piece_samples=5)
    assert resumed.calls == 12 - 5  # the first piece was kept, the cut one written again
    assert manifest["pieces"] == 3 and len(manifest["shards"]) == 3
    _same_samples(root, fp32_cache)  # bit for bit the one-go build
    again = _Counting(target)
    assert build_cache_in_pieces(again, records, root, FP32, piece_samples=5) == manifest
    assert again.calls == 0

    other = _Counting(target)  # other records in the same folder: cleared and built anew
    build_cache_in_pieces(other, records[:4], root, FP32, piece_samples=5)
    assert other.calls == 4 and len(FeatureCache.open(root)) == 4


def test_pieces_are_shared_between_processes(target, records, fp32_cache, tmp_path):
    from dspark.data.cache_pieces import build_cache_in_pieces
    from dspark.data.records import Claims

    root = tmp_path / "shared"
    with pytest.raises(KeyboardInterrupt):  # lays the folder out, writes nothing
        build_cache_in_pieces(_Counting(target, crash_after=0), records, root, FP32, piece_samples=5)
    other = Claims(root / "claims")  # another process, writing piece 0
    assert other.take("0")
    helper = _Counting(target)
    assert build_cache_in_pieces(helper, records, root, FP32, piece_samples=5, wait_for_others=False) is None
    assert helper.calls == 12 - 5  # the two pieces nobody held
    other.close()  # that process dies: its piece is free
    owner = _Counting(target)
    build_cache_in_pieces(owner, records, root, FP32, piece_samples=5, poll_s=0.01)
    assert owner.calls == 5
    _same_samples(root, fp32_cache)


def test_a_process_arriving_while_another_lays_the_folder_out_joins_it(
    target_dir, target, records, tmp_path, monkeypatch
):
    """The second of two processes started together waits for the first to write build.json,
    then writes pieces beside it; it used to read build.json too early and give up (CI, stop 31)."""
    import threading

    from dspark.data import cache_pieces

    root = tmp_path / "together"
    waiting = threading.Event()
    held, clear = cache_pieces._held, cache_pieces.clear_folder
    second: dict = {}
    own_target = TargetAdapter.from_pretrained(target_dir)  # a process has its own model

    def note_the_wait(path):
        if threading.current_thread().name == "second" and path.name == "setup.lock":
            waiting.set()
        return held(path)

    def second_arrives_meanwhile(folder):  # the first process, laying the folder out
        def run():
            try:
                second["result"] = cache_pieces.build_cache_in_pieces(
                    own_target, records, root, FP32, piece_samples=5, wait_for_others=False
                )
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                second["error"] = e

        second["thread"] = threading.Thread(target=run, name="second")
        second["thread"].start()
        waiting.wait(timeout=60)
        clear(folder)

    monkeypatch.setattr(cache_pieces, "_held", note_the_wait)
    monkeypatch.setattr(cache_pieces, "clear_folder", second_arrives_meanwhile)
    manifest = cache_pieces.build_cache_in_pieces(target, records, root, FP32, piece_samples=5)
    second["thread"].join(timeout=120)
    assert waiting.is_set() and "error" not in second, second.get("error")
    assert manifest["pieces"] == 3 and len(FeatureCache.open(root)) == len(records)
