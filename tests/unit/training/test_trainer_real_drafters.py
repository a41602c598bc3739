"""The trainer on the real drafters (DESIGN §5, §6): 2 steps each, checkpoint keys, exact resume."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from dspark.drafters.dflash import DFlashConfig, DFlashDrafter
from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
from dspark.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from dspark.training.checkpoint import load_checkpoint
from dspark.training.trainer import TrainConfig, train

from .toy_drafter import tiny_target, toy_samples

MASK_ID = 63  # the random tiny target's last id; samples use ids 3..63, so it may appear: harmless here
DRAFTERS = {
    "dflash": (DFlashDrafter, DFlashConfig(num_layers=1, block_size=3, mask_token_id=MASK_ID), {"ce"}),
    "dspark": (
        DSparkDrafter,
        DSparkConfig(num_layers=1, block_size=3, mask_token_id=MASK_ID, markov_rank=4),
        {"ce", "tv", "conf", "confidence_bias"},
    ),
    "eagle3": (Eagle3Drafter, Eagle3Config(block_size=3), {"soft_ce"}),
}


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _cfg(tmp_path, name, **kw) -> TrainConfig:
    base = dict(
        output_dir=str(tmp_path / name), max_steps=2, global_batch_size=2, micro_batch_size=1, lr=1e-2,
        num_anchors=3, save_every=1, log_every=1, progress=False,
    )  # fmt: skip
    return TrainConfig(**(base | kw))


def _build(target, name, seed=0):
    cls, config, _ = DRAFTERS[name]
    torch.manual_seed(seed)
    return cls.from_target(target, config)


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_two_steps_train_and_checkpoint_every_key(tmp_path, target, name):
    drafter = _build(target, name)
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    result = train(_cfg(tmp_path, name), target, drafter, toy_samples(4))
    assert result.step == 2
    ckpt = load_checkpoint(result.checkpoint)
    assert ckpt.model_state.keys() == drafter.state_dict().keys()  # DESIGN §5.4: exactly the state dict
    for k, v in drafter.state_dict().items():
        assert torch.equal(ckpt.model_state[k], v), k
    assert torch.equal(drafter.lm_head.weight, before["lm_head.weight"])  # frozen (DESIGN §6)
    assert torch.equal(drafter.embed_tokens.weight, before["embed_tokens.weight"])
    assert not torch.equal(drafter.fc.weight, before["fc.weight"])  # trained
    assert ckpt.model_config["block_size"] == 3 and ckpt.model_config["architectures"] == [
        type(drafter).__name__
    ]
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["loss"] is not None and r["loss"] > 0 for r in rows)
    expected = {"loss", "lr", "grad_norm", "expected_tau", "acceptance/1"} | DRAFTERS[name][2]
    assert expected <= rows[-1].keys(), expected - rows[-1].keys()


def test_dspark_resume_one_plus_one_equals_two(tmp_path, target):
    """Real anchors, a frozen shared embedding and the Markov head resume exactly."""
    data = toy_samples(4)
    straight = _build(target, "dspark")
    train(_cfg(tmp_path, "straight"), target, straight, data)
    # Replay a crash right after step 1's checkpoint: keep only that one in a copy of the run.
    root = tmp_path / "resumed" / "checkpoints"
    shutil.copytree(tmp_path / "straight" / "checkpoints" / "step_00000001", root / "step_00000001")
    (root / "latest").write_text("step_00000001\n")
    resumed = _build(target, "dspark", seed=7)  # a different init: the checkpoint must win
    result = train(_cfg(tmp_path, "resumed"), target, resumed, data)
    assert (result.start_step, result.step) == (1, 2)
    for k, v in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[k], v), k
