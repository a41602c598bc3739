"""Checkpoint integrity (issue 15): sha256 per file in COMPLETE, verified on resume, with fallback;
``latest`` cannot point outside its folder; a failed write is one clear error."""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import subprocess
import sys

import pytest
import torch

from dspark.training import checkpoint as ck
from dspark.training.trainer import TrainConfig, train

from .toy_drafter import ToyConfig, ToyDrafter, tiny_target, toy_samples


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _cfg(tmp_path, name: str, max_steps: int = 4) -> TrainConfig:
    return TrainConfig(
        output_dir=str(tmp_path / name), max_steps=max_steps, global_batch_size=4, micro_batch_size=4,
        lr=1e-2, num_anchors=None, save_every=2, log_every=1, progress=False,
    )  # fmt: skip


def _drafter(target, seed=1) -> ToyDrafter:
    torch.manual_seed(seed)
    return ToyDrafter(ToyConfig(dropout=0.2), target)


def _flip_byte(path, offset_from_end: int = 64) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0xFF  # inside the tensor data, past the header
    path.write_bytes(bytes(data))


DAMAGE = {
    "flipped model bytes": lambda f: _flip_byte(f / "model.safetensors"),
    "flipped optimizer bytes": lambda f: _flip_byte(f / "optimizer.safetensors"),
    "truncated model": lambda f: (f / "model.safetensors").write_bytes(
        (f / "model.safetensors").read_bytes()[:100]
    ),
    "emptied optimizer": lambda f: (f / "optimizer.safetensors").write_bytes(b""),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_latest_checkpoint_falls_back_with_a_warning(tmp_path, target, caplog, damage):
    data = toy_samples(10)
    clean = _drafter(target)
    train(_cfg(tmp_path, "clean"), target, clean, data)  # steps 1..4 in one go

    train(_cfg(tmp_path, "damaged"), target, _drafter(target), data)  # checkpoints at 2 and 4
    root = tmp_path / "damaged" / "checkpoints"
    DAMAGE[damage](root / "step_00000004")
    resumed = _drafter(target, seed=7)
    with caplog.at_level(logging.WARNING, logger="dspark.training.checkpoint"):
        result = train(_cfg(tmp_path, "damaged"), target, resumed, data)
    assert result.start_step == 2 and result.step == 4  # resumed from the intact step 2, redid 3..4
    assert any("corrupt" in r.getMessage() and "step_00000004" in r.getMessage() for r in caplog.records)
    for k, v in clean.state_dict().items():
        assert torch.equal(resumed.state_dict()[k], v), k  # = a clean run from that checkpoint
    ck.verify_checkpoint(root / "step_00000004")  # re-saved intact


def test_the_marker_holds_every_file_checksum(tmp_path, target):
    train(_cfg(tmp_path, "run", max_steps=2), target, _drafter(target), toy_samples(6))
    folder = tmp_path / "run" / "checkpoints" / "step_00000002"
    marker = json.loads((folder / ck.MARKER).read_text())
    assert set(marker["sha256"]) == {p.name for p in folder.iterdir() if p.name != ck.MARKER}
    assert marker["sha256"]["model.safetensors"] == ck.file_sha256(folder / "model.safetensors")


def test_every_checkpoint_corrupt_is_one_clear_error(tmp_path, target):
    train(_cfg(tmp_path, "run", max_steps=2), target, _drafter(target), toy_samples(6))
    _flip_byte(tmp_path / "run" / "checkpoints" / "step_00000002" / "model.safetensors")
    with pytest.raises(ck.CheckpointError, match="no valid checkpoint.*sha256"):
        train(_cfg(tmp_path, "run", max_steps=2), target, _drafter(target), toy_samples(6))


@pytest.mark.parametrize("pointer", ["../elsewhere", "/etc", "step_00000002/../../x", "step_x"])
def test_the_latest_pointer_cannot_leave_its_folder(tmp_path, pointer):
    from .test_checkpoint import _ckpt

    root = tmp_path / "ckpts"
    ck.save_checkpoint(root, _ckpt(2))
    outside = tmp_path / "elsewhere"  # a complete-looking checkpoint outside the folder
    outside.mkdir()
    (outside / ck.MARKER).write_text(json.dumps({"files": []}))
    (root / ck.LATEST).write_text(pointer + "\n")
    assert ck.latest_checkpoint(root) == root / "step_00000002"


def test_a_failed_checkpoint_write_is_one_clear_error(tmp_path):
    """A file-size limit stands in for a full disk: the write fails with an OSError mid-save."""
    script = f"""
import sys, torch
sys.path.insert(0, {os.getcwd()!r})
from dspark.cli import main
from dspark.training import checkpoint as ck
from tests.unit.training.test_checkpoint import _ckpt
ckpt = _ckpt(1)
ckpt.model_state["big"] = torch.zeros(1 << 20)  # 4 MiB: over the limit
try:
    ck.save_checkpoint({str(tmp_path / "ckpts")!r}, ckpt)
except ck.CheckpointError as e:
    print("ERROR", e)
"""

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG as an OSError instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit_file_size,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ERROR cannot write the step 1 checkpoint") and "too large" in done.stdout
    assert not any((tmp_path / "ckpts").glob(".tmp-*"))  # nothing half-written left behind
