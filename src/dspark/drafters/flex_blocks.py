"""Packed-block attention through ``torch.nn.attention.flex_attention`` (DESIGN §6).

The same attention as :func:`~dspark.drafters.attention.attend_packed_blocks` — each
block of K slots sees the context entries its :class:`PackedBlockMask` allows and its
own slots, nothing else — as one flex-attention call over ``[ctx ; every block]`` with a
block mask built from a ``mask_mod``. Flex skips the 128 × 128 tiles the mask leaves
empty (other rows' context, other blocks), and on CUDA it runs as one fused compiled
kernel instead of the per-row matmuls and the materialized ``[n*K, c]`` scores of the
packed path. The CPU keeps the packed path in training; flex runs there eagerly, which
is what the tests use to check that both agree.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import Tensor

from dspark.drafters.attention import PackedBlockMask


def block_mask_mod(context: Tensor, block_size: int):
    """``mask_mod(b, h, q, kv)`` of packed blocks: keys ``kv < C`` are context (allowed by
    ``context [B, N, C]`` for the query's block ``q // K``), later keys are slots (allowed
    iff in the query's own block)."""
    C = context.shape[-1]

    def mask_mod(b, h, q_idx, kv_idx):
        block = q_idx // block_size
        in_context = kv_idx < C
        seen = context[b, block, kv_idx.clamp(max=C - 1)]
        own = (kv_idx - C) // block_size == block
        return (in_context & seen) | (~in_context & own)

    return mask_mod


def dense_mask(mask: PackedBlockMask, num_queries: int) -> Tensor:
    """The boolean ``[B, 1, Q, C + Q]`` mask that :func:`block_mask_mod` describes (for checks)."""
    B, _, C = mask.context.shape
    q = torch.arange(num_queries, device=mask.context.device)
    kv = torch.arange(C + num_queries, device=mask.context.device)
    mod = block_mask_mod(mask.context, mask.block_size)
    rows = [mod(b, 0, q.view(-1, 1), kv.view(1, -1)) for b in range(B)]
    return torch.stack(rows).unsqueeze(1)


@functools.cache
def _flex(compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True) if compiled else flex_attention


def with_flex_mask(mask: PackedBlockMask, num_queries: int) -> PackedBlockMask:
    """``mask`` with its flex block mask over ``[ctx ; num_queries slots]`` keys, built once per forward.

    Every draft layer then attends through flex (:func:`attend_packed_blocks_flex`).
    """
    from torch.nn.attention.flex_attention import create_block_mask

    if mask.prefix is not None:
        raise ValueError("flex attention does not take a prefix (Eagle3); use attend_packed_blocks")
    B, _, C = mask.context.shape
    if C == 0:  # every anchor at position 0: nothing to mask but the blocks, the packed path does it
        return mask
    device = mask.context.device
    mod = block_mask_mod(mask.context, mask.block_size)
    flex = create_block_mask(
        mod, B, None, num_queries, C + num_queries, device=device, _compile=device.type == "cuda"
    )
    return dataclasses.replace(mask, flex_mask=flex)


def attend_packed_blocks_flex(
    q: Tensor, ctx_k: Tensor, ctx_v: Tensor, k: Tensor, v: Tensor, mask: PackedBlockMask
) -> Tensor:
    """:func:`~dspark.drafters.attention.attend_packed_blocks` as one flex-attention call.

    q ``[B, nh, N*K, hd]``; ctx_k/ctx_v ``[B, nkv, C, hd]``; k/v ``[B, nkv, N*K, hd]``;
    ``mask.flex_mask`` from :func:`with_flex_mask`. Compiled on CUDA, eager elsewhere.
    """
    keys, values = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)  # [B, nkv, C+Q, hd]
    attend = _flex(q.device.type == "cuda")
    return attend(q, keys, values, block_mask=mask.flex_mask, enable_gqa=q.shape[1] != ctx_k.shape[1])
