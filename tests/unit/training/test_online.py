"""Online target features and anchors inside the training step (SPEC §6, §7.3)."""

from __future__ import annotations

import pytest
import torch

from dspark.data.samples import collate
from dspark.drafters.blocks import eligible_anchors
from dspark.errors import DsparkError
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
