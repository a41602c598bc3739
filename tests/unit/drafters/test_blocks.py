"""Anchors, block layout and the attention masks of packed training blocks (DESIGN §6).

The rule: a block never sees another block, nor context at or after its anchor. It is
checked on the masks themselves and end to end, by perturbing what a block must not see
and checking that its outputs do not move.
"""

from __future__ import annotations

import pytest
import torch

from dspark.drafters.blocks import (
    block_attention_mask,
    block_layout,
    chain_attention_mask,
    eligible_anchors,
    sample_anchors,
)
from dspark.targets import TargetAdapter
from tests.unit.drafters.builders import BLOCK, build, make_batch, prompt

T_, F_ = True, False


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_eligible_anchors_need_two_supervised_tokens():
    mask = torch.tensor([[0, 1, 1, 1, 0, 1, 1]], dtype=torch.bool)
    assert eligible_anchors(mask).tolist() == [[F_, T_, T_, F_, F_, T_, F_]]


def test_prompt_end_anchors_add_the_token_before_each_response():
    """The recipe beside DESIGN §6: the prompt's last token (0 then 1 in the mask) anchors too,
    its block drafting the answer's first tokens; nothing else changes."""
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 1, 1]], dtype=torch.bool)
    assert eligible_anchors(mask, prompt_end=True).tolist() == [[F_, T_, T_, T_, F_, F_, T_, T_, F_]]
    assert eligible_anchors(mask).tolist() == [[F_, F_, T_, T_, F_, F_, F_, T_, F_]]
    anchors = sample_anchors(mask, 16, prompt_end=True)
    assert anchors.tolist() == [[1, 2, 3, 6, 7]]
    layout = block_layout(torch.arange(9).unsqueeze(0), mask, anchors, 3)
    assert layout.labels[0, 0].tolist() == [2, 3, 4] and layout.valid[0, 0].tolist() == [T_, T_, T_]
    assert layout.valid[0, 3].tolist() == [T_, T_, F_]  # the second turn's: up to the end


def test_sample_anchors():
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[0, 5:35] = True  # 29 eligible
    mask[1, 30:33] = True  # 2 eligible
    anchors = sample_anchors(mask, 8, torch.Generator().manual_seed(0))
    assert anchors.shape == (2, 8)
    first = anchors[0]
    assert len(set(first.tolist())) == 8 and torch.equal(first, first.sort().values)
    assert bool(eligible_anchors(mask)[0, first].all())
    assert anchors[1].tolist() == [30, 31] + [-1] * 6
    again = sample_anchors(mask, 8, torch.Generator().manual_seed(0))
    assert torch.equal(anchors, again)
    assert not torch.equal(anchors, sample_anchors(mask, 8, torch.Generator().manual_seed(1)))
    assert sample_anchors(mask, 100).shape == (2, 29)  # capped by what the sequence offers


def test_block_layout_supervises_the_contiguous_prefix():
    ids = torch.arange(10, 20).view(1, 10)
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    layout = block_layout(ids, mask, torch.tensor([[1, 7, -1]]), block_size=3)
    assert layout.positions.tolist() == [[[1, 2, 3], [7, 8, 9], [0, 1, 2]]]
    assert layout.labels.tolist() == [[[12, 13, 14], [18, 19, 0], [11, 12, 13]]]
    # Block 0: label 13 (position 3) is unsupervised, so slot 1 and every slot after it
    # (label 14 is supervised again) do not count; block 1 runs past the end; the
    # padding block counts nowhere.
    assert layout.valid.tolist() == [[[T_, F_, F_], [T_, T_, F_], [F_, F_, F_]]]


def test_block_attention_mask_by_hand():
    mask = block_attention_mask(torch.tensor([[1, 3]]), context_len=4, block_size=2)
    expected = [
        # ctx 0..3     | block 0 | block 1
        [T_, F_, F_, F_, T_, T_, F_, F_],
        [T_, F_, F_, F_, T_, T_, F_, F_],
        [T_, T_, T_, F_, F_, F_, T_, T_],
        [T_, T_, T_, F_, F_, F_, T_, T_],
    ]
    assert mask.shape == (1, 1, 4, 8)
    assert mask[0, 0].tolist() == expected
    padded = block_attention_mask(torch.tensor([[-1]]), context_len=2, block_size=2)
    assert padded[0, 0].tolist() == [[F_, F_, T_, T_]] * 2  # sees only itself, never an empty row


def test_chain_attention_mask_by_hand():
    mask = chain_attention_mask(torch.tensor([[2, 3]]), context_len=3, num_steps=2)
    expected = [
        # entries 0..2 | step 1 (a0, a1) | step 2 (a0, a1)
        [T_, T_, F_, T_, F_, T_, F_],
        [T_, T_, T_, F_, T_, F_, T_],
    ]
    assert mask[0, 0].tolist() == expected


# -- end to end: what a block may not see does not move its outputs --------------------


@pytest.fixture
def target(tiny_qwen3) -> TargetAdapter:
    return TargetAdapter(tiny_qwen3)


ANCHORS = torch.tensor([[4, 12]])
T = 20


def outputs(drafter, batch):
    with torch.no_grad():
        out = drafter.forward_train(batch)
    return out.logits, out.confidences


@pytest.mark.parametrize("name", ["dflash", "dspark_markov", "dspark_rnn", "eagle3"])
def test_blocks_ignore_later_context_and_other_blocks(target, name):
    drafter = build(name, target)
    ids = torch.tensor([prompt(T)])
    loss_mask = torch.ones(1, T, dtype=torch.bool)
    batch = make_batch(target, ids, loss_mask, anchors=ANCHORS)
    logits, conf = outputs(drafter, batch)

    # Context at and after block 0's anchor (features 4..T-1) changes: block 0 must not move.
    late = make_batch(target, ids, loss_mask, anchors=ANCHORS)
    late.features[:, 4:] += torch.randn_like(late.features[:, 4:])
    late_logits, late_conf = outputs(drafter, late)
    torch.testing.assert_close(late_logits[0, 0], logits[0, 0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(late_logits[0, 1], logits[0, 1], atol=1e-3), "block 1 must see feature 4..11"
    if conf is not None:
        torch.testing.assert_close(late_conf[0, 0], conf[0, 0], atol=1e-5, rtol=1e-5)

    # Block 1's own inputs (its anchor and teacher-forced tokens, positions 12..15) change:
    # block 0 (positions 4..7, context before 4) must not move.
    other = ids.clone()
    other[0, 12:16] = torch.tensor([101, 102, 103, 104])
    swapped = make_batch(target, other, loss_mask, anchors=ANCHORS)
    swapped.features[:] = batch.features  # same context everywhere, only the tokens differ
    swapped_logits, _ = outputs(drafter, swapped)
    torch.testing.assert_close(swapped_logits[0, 0], logits[0, 0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(swapped_logits[0, 1], logits[0, 1], atol=1e-3)

    # And the context before the anchor does matter.
    early = make_batch(target, ids, loss_mask, anchors=ANCHORS)
    early.features[:, :3] += torch.randn_like(early.features[:, :3])
    assert not torch.allclose(outputs(drafter, early)[0][0, 0], logits[0, 0], atol=1e-3)


def test_packing_equals_one_block_per_forward(target):
    """Blocks packed in one forward = each block alone."""
    drafter = build("dspark_markov", target)
    ids = torch.tensor([prompt(T)])
    loss_mask = torch.ones(1, T, dtype=torch.bool)
    packed, _ = outputs(drafter, make_batch(target, ids, loss_mask, anchors=torch.tensor([[3, 9, 14]])))
    for i, a in enumerate((3, 9, 14)):
        alone, _ = outputs(drafter, make_batch(target, ids, loss_mask, anchors=torch.tensor([[a]])))
        torch.testing.assert_close(packed[0, i], alone[0, 0], atol=1e-5, rtol=1e-5)
    assert packed.shape[2] == BLOCK
