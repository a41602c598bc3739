"""Attention for the draft layers: RoPE, masked SDPA, and the packed-block attention of training.

:func:`attend` is SDPA with grouped KV heads and an explicit boolean mask (inference and
Eagle3). :func:`attend_packed_blocks` is training's attention over packed blocks (DESIGN §6):
each block scores only its own batch row's context and its own slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """Rotary tables for integer ``positions [B, T]`` → cos, sin ``[B, T, head_dim]`` (fp32)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    angles = positions.float().unsqueeze(-1) * inv_freq  # [B, T, hd/2]
    angles = torch.cat([angles, angles], dim=-1)  # [B, T, hd]
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x [B, n, T, hd]`` by the tables ``[B, T, hd]`` (rotate-half convention, as HF)."""
    cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)  # [B, 1, T, hd]
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)  # [B, n, T, hd]
    return x * cos + rotated * sin


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Scaled dot-product attention with grouped KV heads.

    q ``[B, nh, Tq, hd]``; k, v ``[B, nkv, Tk, hd]``; mask ``[B, 1, Tq, Tk]`` bool
    (True = attend) or None (attend everywhere). Returns ``[B, nh, Tq, hd]``.
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)  # [B, nh, Tk, hd]
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@dataclass(frozen=True)
class PackedBlockMask:
    """Who sees what when N blocks of K slots are packed into one sequence of N*K queries.

    ``context [B, N, C]`` bool: block n sees context entry c. Inside its block a slot sees
    every slot (bidirectional, DESIGN §5.1); it never sees another block. ``spans`` (from
    :meth:`~dspark.drafters.blocks.PackedBlocks.row_spans`) lists ``(n0, n1, c0, c1)``:
    blocks ``n0:n1`` can only see context ``c0:c1`` (their batch row), so the scores
    outside those rectangles are never computed. ``prefix`` holds keys/values of earlier
    entries of each block that all its queries also see (Eagle3's chain so far).
    """

    context: Tensor  # [B, N, C] bool
    block_size: int  # queries per block
    spans: tuple[tuple[int, int, int, int], ...] | None = None
    prefix: tuple[Tensor, Tensor] | None = None  # keys, values [B, nkv, N, P, hd]
    # A flex-attention BlockMask of the same pattern (drafters/flex_blocks.py); when set, the
    # layers attend through flex attention instead of attend_packed_blocks.
    flex_mask: object | None = None


def attend_packed_blocks(
    q: Tensor, ctx_k: Tensor, ctx_v: Tensor, k: Tensor, v: Tensor, mask: PackedBlockMask
) -> Tensor:
    """Attention of packed blocks over their visible context and their own block only.

    q ``[B, nh, N*K, hd]``; ctx_k/ctx_v ``[B, nkv, C, hd]``; k/v ``[B, nkv, N*K, hd]`` (the
    blocks' own, after ``mask.prefix`` if given). Equal to SDPA over ``[ctx ; every block]`` with
    :func:`~dspark.drafters.blocks.block_attention_mask`, but scores only each block's own
    row of context and its own K slots: ``Σ_rows N_r*K*(C_r + K)`` scores instead of
    ``N*K*(C + N*K)``. The softmax runs over the context and own-block scores together.
    """
    B, nh, Q, hd = q.shape
    K = mask.block_size
    N, C = Q // K, ctx_k.shape[2]
    assert Q == N * K and mask.context.shape == (B, N, C), f"{tuple(mask.context.shape)} vs {(B, N, C)}"
    nkv = ctx_k.shape[1]
    k_own, v_own = k.view(B, nkv, N, K, hd), v.view(B, nkv, N, K, hd)
    if mask.prefix is not None:
        k_own, v_own = (
            torch.cat([p, x], dim=3) for p, x in zip(mask.prefix, (k_own, v_own))
        )  # [B, nkv, N, P+K, hd]
    groups = nh // nkv
    if groups > 1:
        ctx_k, ctx_v, k_own, v_own = (
            x.repeat_interleave(groups, dim=1) for x in (ctx_k, ctx_v, k_own, v_own)
        )
    q = q * hd**-0.5
    s_own = q.view(B, nh, N, K, hd) @ k_own.transpose(-1, -2)  # [B, nh, N, K, P+K]
    outs = []
    for n0, n1, c0, c1 in mask.spans or ((0, N, 0, C),):
        n, c = n1 - n0, c1 - c0
        s_ctx = q[:, :, n0 * K : n1 * K] @ ctx_k[:, :, c0:c1].transpose(-1, -2)  # [B, nh, n*K, c]
        s_ctx = s_ctx.view(B, nh, n, K, c).masked_fill(
            ~mask.context[:, n0:n1, c0:c1].view(B, 1, n, 1, c), -torch.inf
        )
        p = torch.softmax(torch.cat([s_ctx, s_own[:, :, n0:n1]], dim=-1).float(), dim=-1).to(q.dtype)
        out = p[..., :c].reshape(B, nh, n * K, c) @ ctx_v[:, :, c0:c1]  # [B, nh, n*K, hd]
        outs.append(out + (p[..., c:] @ v_own[:, :, n0:n1]).reshape(B, nh, n * K, hd))
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
