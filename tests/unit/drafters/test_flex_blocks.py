"""Flex-attention packed blocks equal the packed path (issue 14 item 3), checked on the CPU (eager flex)."""

from __future__ import annotations

import warnings

import pytest
import torch

from dspark.drafters.attention import PackedBlockMask, attend_packed_blocks
from dspark.drafters.blocks import block_layout, pack_blocks
from dspark.drafters.flex_blocks import attend_packed_blocks_flex, dense_mask, with_flex_mask
from dspark.training import online
from dspark.training.objective import drafter_loss

from .builders import build

K = 3


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex attention warns that it runs uncompiled on the CPU
        yield


def packed_mask() -> PackedBlockMask:
    """Two rows (T = 20): anchors 2, 5, 11 in row 0 and 4, 15 in row 1, as the drafters pack them."""
    ids = torch.zeros(2, 20, dtype=torch.long)
    anchors = torch.tensor([[2, 5, 11], [4, 15, -1]])
    blocks = pack_blocks(block_layout(ids, torch.ones_like(ids, dtype=torch.bool), anchors, K), 20)
    return PackedBlockMask(blocks.context_mask().unsqueeze(0), K, blocks.row_spans())


def test_the_mask_function_is_the_packed_block_mask():
    mask = packed_mask()
    _, N, C = mask.context.shape
    block = torch.arange(N).repeat_interleave(K)  # [N*K]
    expected = torch.cat(
        [mask.context[0].repeat_interleave(K, dim=0), block.unsqueeze(1) == block.unsqueeze(0)], dim=-1
    )  # [N*K, C + N*K]
    assert torch.equal(dense_mask(mask, N * K)[0, 0], expected)
    assert expected[:, :C].any() and not expected[:, :C].all()  # both kinds of context entries occur


def test_flex_attention_equals_the_packed_path_with_grouped_heads():
    """Forward only: flex attention has no backward on the CPU (tests/gpu checks gradients on CUDA)."""
    mask = packed_mask()
    _, N, C = mask.context.shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, N * K, 16, generator=g)
    ctx_k, ctx_v = (torch.randn(1, 2, C, 16, generator=g) for _ in range(2))
    k, v = (torch.randn(1, 2, N * K, 16, generator=g) for _ in range(2))
    packed = attend_packed_blocks(q, ctx_k, ctx_v, k, v, mask)
    flex = attend_packed_blocks_flex(q, ctx_k, ctx_v, k, v, with_flex_mask(mask, N * K))
    torch.testing.assert_close(flex, packed, rtol=0, atol=1e-5)
    wrong = attend_packed_blocks(q, ctx_k, ctx_v, k, v, packed_mask_without_context(mask))
    assert (wrong - packed).abs().max() > 1e-2  # the context really enters the comparison


def packed_mask_without_context(mask: PackedBlockMask) -> PackedBlockMask:
    return PackedBlockMask(torch.zeros_like(mask.context), mask.block_size, mask.spans)


@pytest.mark.parametrize("name", ["dflash", "dspark_markov"])
@torch.no_grad()
def test_a_drafter_gives_the_same_loss_through_flex_attention(target, name):
    drafter = build(name, target).train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 100, (2, 24), generator=g)
    loss_mask = torch.ones_like(ids, dtype=torch.bool)
    loss_mask[:, :5] = False
    batch = online.target_batch(target, ids, loss_mask, num_anchors=5, generator=g)
    losses = []
    for flex in (False, True):
        drafter.backbone.flex_attention = flex
        losses.append(drafter_loss(drafter.config, drafter.forward_train(batch)).loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=1e-5)


def test_without_any_context_the_packed_path_is_kept():
    ids = torch.zeros(1, 8, dtype=torch.long)
    blocks = pack_blocks(block_layout(ids, torch.ones_like(ids, dtype=torch.bool), torch.tensor([[0]]), K), 8)
    mask = PackedBlockMask(blocks.context_mask().unsqueeze(0), K, blocks.row_spans())
    assert mask.context.shape[-1] == 0 and with_flex_mask(mask, K).flex_mask is None
