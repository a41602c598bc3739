"""Training blocks: anchor sampling, block layout and attention masks (DESIGN §6).

A training sequence of T tokens yields A *blocks*, one per sampled anchor position
``a``. Slot ``k`` of a block (``k = 0..K-1``) sits at position ``a + k`` and predicts the
token at ``a + k + 1``, so slot 0 holds the anchor itself (DESIGN §5.1). Many blocks of
many sequences go through the drafter in one forward; the attention masks here keep
them apart: **a block never sees another block, nor context at or after its anchor**.

Everything is a pure function of tensors. Anchor tensors are ``[B, A]`` long with
``-1`` as padding (rows with fewer eligible anchors than the widest row).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dspark.protocols import TrainBatch

PAD_ANCHOR = -1


def eligible_anchors(loss_mask: Tensor, prompt_end: bool = False) -> Tensor:
    """Positions ``i`` where tokens ``i`` and ``i + 1`` are both supervised: ``[B, T]`` bool.

    The anchor itself must be a response token (it was emitted by the target) and its
    block must supervise at least the next token. ``prompt_end``: also the token before
    each response (the prompt's last), whose block drafts the answer's first tokens, as a
    request's first round does (a recipe beside DESIGN §6, ``TrainConfig.prompt_end_anchors``).
    """
    assert loss_mask.dim() == 2, f"loss_mask must be [B, T], got {tuple(loss_mask.shape)}"
    mask = loss_mask.bool()
    eligible = torch.zeros_like(mask)
    eligible[:, :-1] = (mask[:, :-1] | prompt_end) & mask[:, 1:]
    return eligible


def sample_anchors(
    loss_mask: Tensor, num_anchors: int, generator: torch.Generator | None = None, prompt_end: bool = False
) -> Tensor:
    """Sample up to ``num_anchors`` distinct eligible anchors per sequence: ``[B, A]`` long.

    Each row holds its anchors in ascending order, then ``-1`` padding. ``A`` is the
    largest number any row got (at most ``num_anchors``); a row with fewer eligible
    positions than ``num_anchors`` keeps them all. Sampling is uniform without
    replacement, reproducible through ``generator``; ``prompt_end``: as :func:`eligible_anchors`.
    """
    assert num_anchors > 0, f"num_anchors must be > 0, got {num_anchors}"
    eligible = eligible_anchors(loss_mask, prompt_end)  # [B, T]
    rows: list[Tensor] = []
    for row in eligible:
        positions = row.nonzero().squeeze(-1)  # [n]
        if positions.numel() > num_anchors:
            pick = torch.randperm(positions.numel(), generator=generator)[:num_anchors]
            positions = positions[pick.to(positions.device)].sort().values
        rows.append(positions)
    A = max((r.numel() for r in rows), default=0)
    anchors = torch.full((len(rows), A), PAD_ANCHOR, dtype=torch.long, device=loss_mask.device)
    for b, positions in enumerate(rows):
        anchors[b, : positions.numel()] = positions
    return anchors


def batch_anchors(
    loss_mask: Tensor, num_anchors: int | None, generator: torch.Generator | None, prompt_end: bool
) -> Tensor | None:
    """The anchors a training batch carries: :func:`sample_anchors`, or None (``num_anchors``
    None) to leave them to the drafter, which takes every eligible one. With ``prompt_end``
    and ``num_anchors`` None, every eligible anchor here, prompt ends included: the drafter's
    own choice would leave them out."""
    if num_anchors is None and not prompt_end:
        return None
    return sample_anchors(loss_mask, num_anchors or loss_mask.shape[1], generator, prompt_end)  # [B, A]


@dataclass(frozen=True)
class BlockLayout:
    """Where the K slots of each of the A blocks per sequence sit, and what they predict."""

    anchors: Tensor  # [B, A] long, -1 = padding
    positions: Tensor  # [B, A, K] long, anchor + k (padding blocks: k)
    labels: Tensor  # [B, A, K] long, the token at position + 1 (0 past the end)
    valid: Tensor  # [B, A, K] bool, the contiguous supervised prefix of each block

    @property
    def block_size(self) -> int:
        return self.positions.shape[-1]


def block_layout(input_ids: Tensor, loss_mask: Tensor, anchors: Tensor, block_size: int) -> BlockLayout:
    """Positions, labels and supervised slots of the blocks at ``anchors`` (DESIGN §6).

    Slot ``k`` is supervised when its label ``input_ids[a + k + 1]`` exists and is in the
    loss mask, and so is every earlier slot of the block: only the contiguous supervised
    prefix counts (a draft after an unsupervised token is never verified).
    """
    B, T = input_ids.shape
    assert loss_mask.shape == (B, T), f"loss_mask {tuple(loss_mask.shape)} != {(B, T)}"
    assert anchors.dim() == 2 and anchors.shape[0] == B, f"anchors must be [B, A], got {tuple(anchors.shape)}"
    assert block_size > 0
    is_block = anchors >= 0  # [B, A]
    k = torch.arange(block_size, device=anchors.device)  # [K]
    positions = anchors.clamp_min(0).unsqueeze(-1) + k  # [B, A, K]
    label_pos = positions + 1  # [B, A, K]
    in_range = label_pos < T  # [B, A, K]
    flat = label_pos.clamp_max(T - 1).flatten(1)  # [B, A*K]
    labels = input_ids.gather(1, flat).view_as(positions)  # [B, A, K]
    supervised = loss_mask.bool().gather(1, flat).view_as(positions) & in_range & is_block.unsqueeze(-1)
    valid = supervised.long().cumprod(dim=-1).bool()  # [B, A, K]: contiguous prefix only
    return BlockLayout(
        anchors=anchors,
        positions=positions,
        labels=torch.where(in_range, labels, torch.zeros_like(labels)),
        valid=valid,
    )


def batch_layout(batch: TrainBatch, block_size: int) -> BlockLayout:
    """The layout of ``batch``'s blocks: at ``batch.anchors``, or at every eligible anchor if None."""
    anchors = batch.anchors
    if anchors is None:
        anchors = sample_anchors(batch.loss_mask, num_anchors=max(1, batch.loss_mask.shape[1]))
    return block_layout(batch.input_ids, batch.loss_mask, anchors.to(batch.input_ids.device), block_size)


@dataclass(frozen=True)
class PackedBlocks:
    """The real blocks of a batch as one flat list, with the context they can see, packed.

    Padding anchors are dropped and the rows' blocks concatenated (row-major), so no
    drafter work is spent on padding. The packed context holds, row after row, the
    entries ``t < max anchor of the row`` (no block sees later ones, padding included).
    """

    rows: Tensor  # [N] long, the batch row of each block
    anchors: Tensor  # [N] long
    positions: Tensor  # [N, K] long, anchor + k
    labels: Tensor  # [N, K] long
    valid: Tensor  # [N, K] bool
    ctx_rows: Tensor  # [C] long, the batch row of each packed context entry
    ctx_positions: Tensor  # [C] long, its position in that row

    @property
    def block_size(self) -> int:
        return self.positions.shape[-1]

    def row_spans(self) -> tuple[tuple[int, int, int, int], ...]:
        """``(n0, n1, c0, c1)`` per batch row: its blocks ``n0:n1`` and its packed context ``c0:c1``."""
        B = int(self.rows.max()) + 1 if self.rows.numel() else 0  # rows with context all have blocks
        blocks = torch.bincount(self.rows, minlength=B).cumsum(0).tolist()
        context = torch.bincount(self.ctx_rows, minlength=B).cumsum(0).tolist()
        spans, n0, c0 = [], 0, 0
        for n1, c1 in zip(blocks, context):
            if n1 > n0:
                spans.append((n0, n1, c0, c1))
            n0, c0 = n1, c1
        return tuple(spans)

    def context_mask(self, limit: Tensor | None = None) -> Tensor:
        """``[N, C]`` bool: block n sees packed entry c iff they share a row and c's position < ``limit[n]``.

        ``limit`` defaults to the anchors (DFlash/DSpark); Eagle3's first step uses anchor - 1.
        """
        limit = self.anchors if limit is None else limit  # [N]
        same_row = self.ctx_rows.unsqueeze(0) == self.rows.unsqueeze(1)  # [N, C]
        return same_row & (self.ctx_positions.unsqueeze(0) < limit.unsqueeze(1))


def pack_blocks(layout: BlockLayout, context_len: int) -> PackedBlocks:
    """The real blocks of ``layout`` and the context entries any of them sees (``context_len`` = T)."""
    keep = layout.anchors >= 0  # [B, A]
    rows = keep.nonzero()[:, 0]  # [N], row-major like the boolean indexing below
    horizon = layout.anchors.max(dim=1).values.clamp_min(0)  # [B]: no block sees t >= horizon
    t = torch.arange(context_len, device=layout.anchors.device)  # [T]
    ctx_rows, ctx_positions = (t.unsqueeze(0) < horizon.unsqueeze(1)).nonzero(as_tuple=True)  # [C], [C]
    return PackedBlocks(
        rows=rows,
        anchors=layout.anchors[keep],
        positions=layout.positions[keep],
        labels=layout.labels[keep],
        valid=layout.valid[keep],
        ctx_rows=ctx_rows,
        ctx_positions=ctx_positions,
    )


def visible_context(anchors: Tensor, context_len: int) -> Tensor:
    """``[B, A, C]`` bool: context entry ``t`` is visible to the block at ``a`` iff ``t < a``.

    Padding anchors (-1) see no context at all.
    """
    t = torch.arange(context_len, device=anchors.device)  # [C]
    return t < anchors.unsqueeze(-1)  # [B, A, C]


def block_attention_mask(anchors: Tensor, context_len: int, block_size: int) -> Tensor:
    """Boolean SDPA mask ``[B, 1, A*K, C + A*K]`` for packed parallel blocks (DFlash/DSpark).

    Queries are the A*K block slots, block-major. Keys are the C context entries
    (position ``t`` = target features of token ``t``) followed by the same A*K slots.
    A slot sees context strictly before its block's anchor and every slot of its own
    block (bidirectional inside the block, DESIGN §5.1); nothing else. ``True`` = attend.
    Every row sees at least its own block, so no row is fully masked.
    """
    B, A = anchors.shape
    K = block_size
    ctx = visible_context(anchors, context_len)  # [B, A, C]
    ctx = ctx.unsqueeze(2).expand(B, A, K, context_len).reshape(B, A * K, context_len)  # [B, A*K, C]
    block_id = torch.arange(A, device=anchors.device).repeat_interleave(K)  # [A*K]
    same_block = (block_id.unsqueeze(1) == block_id.unsqueeze(0)).expand(B, A * K, A * K)  # [B, A*K, A*K]
    return torch.cat([ctx, same_block], dim=-1).unsqueeze(1)  # [B, 1, A*K, C + A*K]


def chain_attention_mask(anchors: Tensor, context_len: int, num_steps: int) -> Tensor:
    """Boolean SDPA mask ``[B, 1, A, C + S*A]`` for one step of Eagle3's training-time test.

    Queries: one per anchor (the chain of that anchor at its current step). Keys: the C
    first-pass entries (entry ``t`` = token ``t + 1`` with the target features of token
    ``t``), then the S = ``num_steps`` chain entries of every anchor, step-major
    (``[step 1: A anchors][step 2: A anchors]...``). A chain sees first-pass entries up to
    and including its anchor's (``t < a``) and its own chain entries only: the causal
    mask plus the diagonal on earlier chunks (DESIGN §5.2).
    """
    B, A = anchors.shape
    ctx = visible_context(anchors, context_len)  # [B, A, C]
    own = torch.eye(A, dtype=torch.bool, device=anchors.device).repeat(1, num_steps)  # [A, S*A]
    return torch.cat([ctx, own.expand(B, A, num_steps * A)], dim=-1).unsqueeze(1)  # [B, 1, A, C + S*A]
