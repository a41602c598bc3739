"""Activation checkpointing and bf16 autocast in the trainer (DESIGN §6, issue 14 item 3)."""

from __future__ import annotations

import pytest
import torch

from dspark.data.samples import collate
from dspark.drafters.dflash import DFlashConfig, DFlashDrafter
from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
from dspark.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from dspark.errors import DsparkError
from dspark.training import online
from dspark.training.objective import drafter_loss
from dspark.training.trainer import TrainConfig, Trainer
from dspark.training.trainer import train as run_training

from .toy_drafter import tiny_target, toy_samples

MASK_ID = 63
BUILDERS = {
    "dflash": lambda t: DFlashDrafter.from_target(
        t, DFlashConfig(num_layers=2, block_size=3, mask_token_id=MASK_ID)
    ),
    "dspark": lambda t: DSparkDrafter.from_target(
        t, DSparkConfig(num_layers=2, block_size=3, mask_token_id=MASK_ID, markov_rank=4)
    ),
}


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_target()


def _loss_and_grads(drafter, batch):
    drafter.zero_grad(set_to_none=True)
    loss = drafter_loss(drafter.config, drafter.forward_train(batch)).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_activation_checkpointing_gives_the_same_loss_and_gradients(target, name):
    torch.manual_seed(0)
    drafter = BUILDERS[name](target).train()
    tb = collate(toy_samples(2), 0)
    batch = online.target_batch(
        target, tb.input_ids, tb.loss_mask, num_anchors=4, generator=torch.Generator().manual_seed(0)
    )
    loss, grads = _loss_and_grads(drafter, batch)
    drafter.backbone.activation_checkpointing = True
    loss_ckpt, grads_ckpt = _loss_and_grads(drafter, batch)
    assert torch.equal(loss, loss_ckpt)
    assert grads.keys() == grads_ckpt.keys() and any("layers.1" in k for k in grads)
    for k in grads:
        torch.testing.assert_close(grads_ckpt[k], grads[k], rtol=0, atol=1e-7, msg=k)


def test_activation_checkpointing_really_recomputes(target):
    """With the flag the draft layers run again in the backward (so their activations were not kept)."""
    drafter = BUILDERS["dflash"](target).train()
    calls = []
    drafter.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    tb = collate(toy_samples(1), 0)
    batch = online.target_batch(target, tb.input_ids, tb.loss_mask, num_anchors=4)
    for flag, expected in ((False, 1), (True, 2)):
        calls.clear()
        drafter.backbone.activation_checkpointing = flag
        drafter_loss(drafter.config, drafter.forward_train(batch)).loss.backward()
        assert len(calls) == expected


def test_train_config_switches_checkpointing_on_and_refuses_drafters_without_it(tmp_path, target):
    cfg = TrainConfig(
        output_dir=str(tmp_path / "a"), max_steps=1, global_batch_size=1, activation_checkpointing=True
    )
    drafter = BUILDERS["dspark"](target)
    Trainer(cfg, target, drafter, _dataset(), _world(target))
    assert drafter.backbone.activation_checkpointing
    assert "activation_checkpointing" not in cfg.identity()  # run control: a resume may switch it
    eagle = Eagle3Drafter.from_target(target, Eagle3Config(block_size=3))
    with pytest.raises(DsparkError, match="activation checkpointing"):
        Trainer(cfg, target, eagle, _dataset(), _world(target))


def test_bf16_autocast_keeps_fp32_master_weights_and_tracks_the_fp32_loss(tmp_path, target):
    losses = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        drafter = BUILDERS["dspark"](target)
        cfg = TrainConfig(
            output_dir=str(tmp_path / precision), max_steps=2, global_batch_size=2, micro_batch_size=2,
            num_anchors=4, precision=precision, progress=False, save_every=0, lr=1e-3,
        )  # fmt: skip
        result = run_training(cfg, target, drafter, toy_samples(4))
        losses[precision] = result.metrics["loss"]
        assert all(p.dtype == torch.float32 for p in drafter.parameters())  # master weights
    assert losses["bf16"] != losses["fp32"]  # autocast really ran in bf16
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.05)


def _dataset():
    from dspark.data.samples import TrainDataset

    return TrainDataset(toy_samples(2))


def _world(target):
    from dspark.training import distributed

    return distributed.current_world(target.device)
