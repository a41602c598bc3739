"""Checkpoints (DESIGN §5.4, §6): atomic writes, the latest pointer, HF layout, no pickle."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from safetensors.torch import load_file

from dspark.training import checkpoint as ck
from dspark.training.trainer import TrainConfig, train

from .toy_drafter import ToyConfig, ToyDrafter, tiny_target, toy_samples


def _ckpt(step: int, **extra) -> ck.Checkpoint:
    torch.manual_seed(step)
    w = torch.randn(4, 3)
    return ck.Checkpoint(
        step=step,
        model_state={"embed_tokens.weight": w, "lm_head.weight": w, "norm.weight": torch.ones(3)},  # tied
        model_config={"architectures": ["Toy"], "block_size": 7},
        optimizer_state={
            "state": {
                "norm.weight": {"step": torch.tensor(float(step)), "exp_avg": torch.randn(3), "k": 0.5}
            },
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": ["norm.weight"]}],
        },
        rng=[ck.capture_rng(), ck.capture_rng()],
        trainer_state={"data": {"position": step}, **extra},
    )


def test_round_trip_is_an_hf_folder_without_pickle(tmp_path, monkeypatch):
    saved = _ckpt(3)
    folder = ck.save_checkpoint(tmp_path, saved)
    assert folder == tmp_path / "step_00000003"
    assert sorted(p.name for p in folder.iterdir()) == [
        "COMPLETE", "config.json", "model.safetensors", "optimizer.safetensors", "rng.json",
        "rng.safetensors", "trainer_state.json",
    ]  # fmt: skip
    assert json.loads((folder / "config.json").read_text()) == {"architectures": ["Toy"], "block_size": 7}
    assert load_file(str(folder / "model.safetensors")).keys() == saved.model_state.keys()

    def no_pickle(*a, **k):
        raise AssertionError("unpickling while loading a checkpoint")

    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(pickle, "loads", no_pickle)
    monkeypatch.setattr(torch, "load", no_pickle)
    loaded = ck.load_checkpoint(folder)
    assert loaded.step == 3 and loaded.trainer_state["data"] == {"position": 3}
    for k, v in saved.model_state.items():
        assert torch.equal(loaded.model_state[k], v)
    state = loaded.optimizer_state["state"]["norm.weight"]
    assert torch.equal(state["exp_avg"], saved.optimizer_state["state"]["norm.weight"]["exp_avg"])
    assert state["step"].item() == 3.0 and state["k"] == 0.5
    assert loaded.optimizer_state["param_groups"] == [
        {"lr": 0.1, "betas": (0.9, 0.95), "params": ["norm.weight"]}
    ]
    assert len(loaded.rng) == 2 and torch.equal(loaded.rng[1].torch_cpu, saved.rng[1].torch_cpu)


def test_rng_capture_restore():
    import random

    import numpy as np

    state = ck.capture_rng()
    first = (torch.rand(3), random.random(), np.random.rand())
    ck.restore_rng(state)
    assert (
        torch.equal(torch.rand(3), first[0]) and random.random() == first[1] and np.random.rand() == first[2]
    )


def test_crash_before_the_marker_keeps_the_previous_latest(tmp_path, monkeypatch):
    ck.save_checkpoint(tmp_path, _ckpt(2))

    def crash(folder, step):  # every other file is written, the marker is not
        assert (folder / "model.safetensors").is_file()
        raise OSError("disk full")

    monkeypatch.setattr(ck, "_write_marker", crash)
    with pytest.raises(ck.CheckpointError, match="disk full"):  # one line for the CLI, not a traceback
        ck.save_checkpoint(tmp_path, _ckpt(4))
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "step_00000002"
    assert (tmp_path / "latest").read_text().strip() == "step_00000002"
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [2]
    monkeypatch.undo()
    ck.save_checkpoint(tmp_path, _ckpt(6))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000002", "step_00000006"]
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "step_00000006"


def test_trainer_crash_mid_save_then_resume(tmp_path, monkeypatch):
    target = tiny_target()
    cfg = TrainConfig(
        output_dir=str(tmp_path / "run"), max_steps=4, global_batch_size=2, micro_batch_size=2, lr=1e-2,
        num_anchors=None, save_every=2, progress=False,
    )  # fmt: skip
    real_marker = ck._write_marker

    def crash_at_four(folder, step):
        if step == 4:  # a kill leaves the temporary folder (an OSError would remove it)
            raise RuntimeError("killed while saving")
        real_marker(folder, step)

    monkeypatch.setattr(ck, "_write_marker", crash_at_four)
    with pytest.raises(RuntimeError, match="killed while saving"):
        train(cfg, target, ToyDrafter(ToyConfig(), target), toy_samples(6))
    root = tmp_path / "run" / "checkpoints"
    assert ck.latest_checkpoint(root).name == "step_00000002"
    assert (root / ".tmp-step_00000004").is_dir()  # the interrupted write, not a checkpoint
    monkeypatch.undo()
    result = train(cfg, target, ToyDrafter(ToyConfig(), target), toy_samples(6))
    assert (result.start_step, result.step) == (2, 4)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000002", "step_00000004"]


def test_stale_pointer_falls_back_to_the_newest_complete(tmp_path):
    for step in (1, 2):
        ck.save_checkpoint(tmp_path, _ckpt(step))
    (tmp_path / "step_00000002" / "COMPLETE").unlink()
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "step_00000001"
    with pytest.raises(ck.CheckpointError, match="not a complete checkpoint"):
        ck.load_checkpoint(tmp_path / "step_00000002")
    assert ck.latest_checkpoint(tmp_path / "nothing-here") is None


def test_resaving_a_step_replaces_it(tmp_path):
    ck.save_checkpoint(tmp_path, _ckpt(2, tag="old"))
    ck.save_checkpoint(tmp_path, _ckpt(2, tag="new"))
    assert ck.load_checkpoint(tmp_path / "step_00000002").trainer_state["tag"] == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000002"]


def test_prune_keeps_the_newest(tmp_path):
    for step in (1, 2, 3, 4):
        ck.save_checkpoint(tmp_path, _ckpt(step))
    ck.prune_checkpoints(tmp_path, keep_last=2)
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [3, 4]


def test_config_differences_name_every_changed_field(tmp_path):
    saved = {"train": {"lr": 0.1, "betas": (0.9, 0.95), "seed": 0}, "drafter": {"block_size": 7}}
    current = {"train": {"lr": 0.2, "betas": [0.9, 0.95], "seed": 0}, "drafter": {"block_size": 7, "new": 1}}
    assert ck.config_differences(saved, current) == ["drafter.new: (absent) -> 1", "train.lr: 0.1 -> 0.2"]
    ck.check_resumable(tmp_path, saved, saved)
    with pytest.raises(ck.ConfigMismatchError, match=r"train\.lr: 0\.1 -> 0\.2"):
        ck.check_resumable(tmp_path, saved, current)


def test_a_field_added_later_at_its_default_does_not_block_resuming():
    from dspark.training.checkpoint import config_differences

    saved = {"train": {"lr": 1e-3}, "drafter": {"num_layers": 2}}
    current = {"train": {"lr": 1e-3, "new_flag": True}, "drafter": {"num_layers": 2, "qk_norm": True}}
    defaults = {"train": {"new_flag": True, "lr": 6e-4}, "drafter": {"qk_norm": True}}
    assert config_differences(saved, current, defaults) == []
    # not at its default, or not declared: the change is named
    assert config_differences(saved, current | {"train": {"lr": 1e-3, "new_flag": False}}, defaults) == [
        "train.new_flag: (absent) -> False"
    ]
    assert config_differences(saved, current) == [
        "drafter.qk_norm: (absent) -> True",
        "train.new_flag: (absent) -> True",
    ]
    # a field the saved run had keeps being compared, defaults or not
    assert config_differences(saved | {"train": {"lr": 1e-2}}, current, defaults)[0].startswith("train.lr")
