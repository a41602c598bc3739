"""Online target features and anchors inside the training step (DESIGN §6, §7.3)."""

from __future__ import annotations

import pytest
import torch

from dspark.data.samples import collate
from dspark.drafters.blocks import eligible_anchors
from dspark.errors import DsparkError
from dspark.training.objective import drafter_loss
from dspark.training.online import anchor_generator, check_feature_layers, target_batch

from .toy_drafter import tiny_target, toy_samples


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def test_features_are_the_targets_and_padding_is_invisible(target):
    long, short = toy_samples(2)
    short = type(short)(short.input_ids[:7], short.loss_mask[:7])
    tb = collate([long, short], pad_id=0)
    batch = target_batch(target, tb.input_ids, tb.loss_mask, num_anchors=None)
    assert batch.anchors is None
    assert batch.features.shape == (2, 12, 2, 32) and batch.target_hidden.shape == (2, 12, 32)
    alone = target.forward(short.input_ids[None], target.new_cache())
    torch.testing.assert_close(batch.features[1, :7], alone.features[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(batch.target_hidden[1, :7], alone.hidden[0], atol=1e-5, rtol=0)
    assert torch.equal(batch.loss_mask, tb.loss_mask) and batch.features.requires_grad is False


def test_anchors_are_eligible_and_a_function_of_seed_step_chunk(target):
    tb = collate(toy_samples(3), pad_id=0)

    def anchors(seed, step, chunk):
        gen = anchor_generator(seed, step, chunk)
        return target_batch(target, tb.input_ids, tb.loss_mask, num_anchors=3, generator=gen).anchors

    a = anchors(0, 5, 1)
    assert a.shape == (3, 3)
    eligible = eligible_anchors(tb.loss_mask)
    assert all(eligible[b, a[b]].all() for b in range(3))
    assert torch.equal(a, anchors(0, 5, 1))
    assert not all(torch.equal(a, anchors(*k)) for k in [(1, 5, 1), (0, 6, 1), (0, 5, 2)])


def test_feature_layers_must_match():
    target = tiny_target()
    check_feature_layers(target, (0, 2))
    with pytest.raises(DsparkError, match=r"reads target layers \(0, 1\)"):
        check_feature_layers(target, (0, 1))


def test_packed_target_forward_gives_the_padded_features_and_the_same_loss():
    """Several samples in one flattened target forward: real tokens' features, hidden states
    and the drafter's loss are those of the padded batch (issue 14 item 2, target side)."""
    from dspark.data.samples import TrainSample
    from dspark.drafters.dspark import DSparkConfig, DSparkDrafter

    target = tiny_target()
    g = torch.Generator().manual_seed(3)
    lengths = [30, 9, 21, 17]  # > 16 tokens attend alone in the flat layout, <= 16 as a group
    samples = []
    for n in lengths:
        mask = torch.ones(n, dtype=torch.bool)
        mask[:3] = False
        samples.append(TrainSample(torch.randint(3, 64, (n,), generator=g), mask))
    tb = collate(samples, 0)

    def batch(**kw):
        gen = torch.Generator().manual_seed(0)
        return target_batch(target, tb.input_ids, tb.loss_mask, num_anchors=6, generator=gen, **kw)

    padded, packed = batch(), batch(lengths=lengths)
    real = torch.arange(tb.input_ids.shape[1]) < torch.tensor(lengths).unsqueeze(1)  # [B, T]
    torch.testing.assert_close(packed.features[real], padded.features[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(packed.target_hidden[real], padded.target_hidden[real], rtol=0, atol=1e-5)
    assert torch.equal(packed.anchors, padded.anchors)
    torch.manual_seed(0)
    config = DSparkConfig(num_layers=1, block_size=3, mask_token_id=63, markov_rank=4)
    drafter = DSparkDrafter.from_target(target, config)
    losses = [drafter_loss(drafter.config, drafter.forward_train(b)).loss for b in (padded, packed)]
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=1e-5)


def test_the_trainer_packs_the_target_forward_when_asked(tmp_path, monkeypatch):
    from dspark.data.samples import TrainSample
    from dspark.drafters.dflash import DFlashConfig, DFlashDrafter
    from dspark.training import online
    from dspark.training.trainer import TrainConfig, train

    target = tiny_target()
    g = torch.Generator().manual_seed(4)
    samples = [
        TrainSample(torch.randint(3, 64, (n,), generator=g), torch.ones(n, dtype=torch.bool))
        for n in (8, 19, 13, 25)
    ]
    seen, losses = [], []
    real = online.packed_features
    monkeypatch.setattr(online, "packed_features", lambda *a: seen.append(a[2]) or real(*a))
    for pack in (False, True):
        torch.manual_seed(0)
        drafter = DFlashDrafter.from_target(
            target, DFlashConfig(num_layers=1, block_size=3, mask_token_id=63)
        )
        cfg = TrainConfig(
            output_dir=str(tmp_path / str(pack)), max_steps=1, global_batch_size=4, micro_batch_size=4,
            num_anchors=4, progress=False, pack_target=pack,
        )  # fmt: skip
        losses.append(train(cfg, target, drafter, samples).metrics["loss"])
    assert len(seen) == 1 and sorted(seen[0]) == [8, 13, 19, 25]  # only the packed run, real lengths
    assert losses[1] == pytest.approx(losses[0], abs=1e-5)
