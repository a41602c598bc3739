"""The DFlash backbone: the parallel block network with KV injection (DESIGN §5.1; paper §2, Eqs. 2-3).

One forward drafts a whole block. The block input is the anchor's embedding in slot 0
and the mask token's in slots 1..γ-1; slot j sits at position ``anchor_pos + j`` and
predicts the token at ``anchor_pos + j + 1`` (γ inputs → γ logits, the DSpark
convention). Slots attend to each other bidirectionally and to the injected context:
the fused target features ``H_ctx`` of every token strictly before the anchor.

:class:`~dspark.drafters.dflash.DFlashDrafter` holds one and samples every slot
independently; :class:`~dspark.drafters.dspark.DSparkDrafter` holds one and adds heads
(:func:`hold_backbone`: the backbone's weights keep their names, ``fc.weight`` etc.).

Inference keeps, per request, the context keys/values of every draft layer in
``state.drafter_cache`` (:class:`~dspark.drafters.request_state.DrafterCache`). They depend
on the target features only, so each round appends the features of the newly committed
tokens and never recomputes the context; drafts never enter the cache.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from dspark.drafters.attention import PackedBlockMask
from dspark.drafters.blocks import PackedBlocks
from dspark.drafters.common import (
    DecoderDims,
    DraftDecoderLayer,
    RMSNorm,
    draft_rope,
    fuse_features,
    init_weights,
    lm_logits,
    scaled_embedding,
    slot_factors,
)
from dspark.drafters.draft_vocab import register_draft_vocab
from dspark.drafters.flex_blocks import with_flex_mask
from dspark.drafters.parts import hold
from dspark.drafters.request_state import batch_context, padded_context_mask, pending_tokens, sync_requests
from dspark.protocols import DrafterTraits, SamplingParams, SequenceState, SlotFactors, TrainBatch


def _train_layer(layer, h, h_ctx, cos_c, sin_c, cos_q, sin_q, mask) -> Tensor:
    """One draft layer over packed blocks ``h [1, N*K, H]``, its context K/V projected from ``h_ctx``."""
    ctx_k, ctx_v = layer.context_kv(h_ctx, cos_c, sin_c)  # [1, nkv, C, hd]
    return layer(h, cos_q, sin_q, ctx_k, ctx_v, mask)


class DFlashBackbone(nn.Module):
    """The parallel block network; attribute names give the DeepSpec keys (DESIGN §5.4).

    ``embed_tokens``/``lm_head`` are frozen copies of the target's; ``fc`` + ``hidden_norm``
    fuse the target features (Eq. 2); ``layers`` are KV-injection decoder layers (Eq. 3).
    """

    def __init__(
        self,
        dims: DecoderDims,
        *,
        num_layers: int,
        block_size: int,
        target_layer_ids: tuple[int, ...] | None,
        mask_token_id: int | None,
        mask_embedding: bool = False,
        draft_vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        if target_layer_ids is None or (mask_token_id is None and not mask_embedding):
            raise ValueError("target_layer_ids and mask_token_id must be set (from_target fills them)")
        self.dims = dims
        self.block_size = block_size
        self.target_layer_ids = tuple(target_layer_ids)
        self.mask_token_id = None if mask_embedding else int(mask_token_id)
        H, V, L = dims.hidden_size, dims.vocab_size, len(self.target_layer_ids)
        N = register_draft_vocab(self, draft_vocab_size, V)  # the LM head's rows
        self.embed_tokens = nn.Embedding(V, H)
        self.fc = nn.Linear(L * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, dims.rms_norm_eps)
        self.layers = nn.ModuleList(DraftDecoderLayer(dims) for _ in range(num_layers))
        self.norm = RMSNorm(H, dims.rms_norm_eps)
        self.lm_head = nn.Linear(H, N, bias=False)
        # The drafter's own mask input when the tokenizer has no mask token (drafters/mask.py).
        self.mask_embedding = nn.Parameter(torch.zeros(H)) if mask_embedding else None
        init_weights(self, dims.initializer_range)
        # Training only, not part of the config or the checkpoint: recompute each draft layer's
        # activations in the backward instead of keeping them (TrainConfig.activation_checkpointing).
        self.activation_checkpointing = False
        # Training only too: attend through flex attention (TrainConfig.attention, CUDA by default).
        self.flex_attention = False
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    # -- pieces ----------------------------------------------------------------------------

    def embed(self, ids: Tensor) -> Tensor:
        """Token embeddings ``[...] → [..., H]``, scaled like the target's (Gemma)."""
        return scaled_embedding(self.embed_tokens, ids, self.dims)

    def context_features(self, features: Tensor) -> Tensor:
        """``H_ctx = RMSNorm(W_c [H^(l1); …; H^(lm)])``: ``[..., L, H] → [..., H]`` (Eq. 2)."""
        return self.hidden_norm(fuse_features(self.fc, features))

    def logits(self, h: Tensor) -> Tensor:
        """LM-head logits ``[..., V]`` fp32 of final-normed hidden states ``[..., H]``."""
        return lm_logits(self.lm_head, h, self.dims.logit_softcap)

    def _block_inputs(self, anchor_ids: Tensor) -> Tensor:
        """Block token ids ``[..., K]``: the anchor in slot 0, the mask token after it."""
        ids = torch.full((*anchor_ids.shape, self.block_size), self.mask_token_id, device=anchor_ids.device)
        ids[..., 0] = anchor_ids
        return ids

    def block_embeddings(self, anchor_ids: Tensor) -> Tensor:
        """Block inputs ``[..., K, H]``: the anchor's embedding, then the mask input in every slot."""
        if self.mask_embedding is None:
            return self.embed(self._block_inputs(anchor_ids))
        anchor = self.embed(anchor_ids).unsqueeze(-2)  # [..., 1, H]
        mask = self.mask_embedding.to(anchor.dtype).expand(*anchor_ids.shape, self.block_size - 1, -1)
        return torch.cat([anchor, mask], dim=-2)  # [..., K, H]

    # -- training ----------------------------------------------------------------------------

    def block_hidden_train(self, batch: TrainBatch, blocks: PackedBlocks) -> Tensor:
        """Final-normed hidden states ``[N, K, H]`` of the batch's real blocks, in one forward (DESIGN §6).

        Every row's blocks and visible context are packed into one sequence (padding
        anchors and never-visible context dropped); each block attends to the context
        entries of its own row strictly before its anchor and to its own slots only
        (:func:`~dspark.drafters.attention.attend_packed_blocks`).
        """
        N, K = blocks.positions.shape
        H = self.dims.hidden_size
        feats = batch.features[blocks.ctx_rows, blocks.ctx_positions]  # [C, L, H]
        h_ctx = self.context_features(feats).unsqueeze(0)  # [1, C, H]
        cos_c, sin_c = draft_rope(self.dims, blocks.ctx_positions.unsqueeze(0))  # [1, C, hd]
        anchor_ids = batch.input_ids[blocks.rows, blocks.anchors]  # [N]
        h = self.block_embeddings(anchor_ids).view(1, N * K, H).to(h_ctx.dtype)  # [1, N*K, H]
        cos_q, sin_q = draft_rope(self.dims, blocks.positions.view(1, N * K))  # [1, N*K, hd]
        mask = PackedBlockMask(blocks.context_mask().unsqueeze(0), K, blocks.row_spans())  # [1, N, C]
        if self.flex_attention:
            mask = with_flex_mask(mask, N * K)
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        for layer in self.layers:
            args = (layer, h, h_ctx, cos_c, sin_c, cos_q, sin_q, mask)
            h = checkpoint(_train_layer, *args, use_reentrant=False) if recompute else _train_layer(*args)
        return self.norm(h).view(N, K, H)

    def slot_factors(
        self,
        h: Tensor,
        batch: TrainBatch,
        blocks: PackedBlocks,
        low_rank: tuple[Tensor, Tensor] | None = None,
    ) -> SlotFactors:
        """The draft and target logits of the packed slots ``[1, N, K]``, as factors (DESIGN §6)."""
        softcap = self.dims.logit_softcap
        return slot_factors(
            self.lm_head,
            h,
            batch.target_hidden,
            blocks.positions,
            softcap,
            rows=blocks.rows,
            low_rank=low_rank,
            draft_ids=self.draft_ids,
            full_head=self.full_head,
        )

    # -- inference ---------------------------------------------------------------------------

    @torch.no_grad()
    def sync_context(self, state: SequenceState) -> None:
        """Append to the context cache the features of committed tokens it lacks.

        The context is every token but the anchor: ``state.features[:T-1]``.
        """
        context = state.drafter_cache.context
        start, end = context.length, len(state.token_ids) - 1
        if start > end:
            raise ValueError(f"request {state.request_id}: drafter context {start} > committed tokens {end}")
        if start == end:
            return
        feats = state.features[start:end].to(self.fc.weight.device)  # [n, L, H]
        h_ctx = self.context_features(feats).unsqueeze(0)  # [1, n, H]
        positions = torch.arange(start, end, device=h_ctx.device).unsqueeze(0)  # [1, n]
        cos, sin = draft_rope(self.dims, positions)  # [1, n, hd]
        kv = torch.stack([torch.stack(layer.context_kv(h_ctx, cos, sin)) for layer in self.layers])
        context.append(kv.squeeze(2))  # [n_layers, 2, nkv, n, hd]

    @torch.no_grad()
    def block_hidden_infer(self, states: list[SequenceState]) -> Tensor:
        """Final-normed hidden states ``[R, K, H]`` of each request's next block (caches synced)."""
        kv, lengths = batch_context([s.drafter_cache.context for s in states])  # [n_layers, 2, R, nkv, C, hd]
        device = kv.device
        anchors = torch.tensor([s.token_ids[-1] for s in states], device=device)  # [R]
        anchor_pos = torch.tensor([len(s.token_ids) - 1 for s in states], device=device)  # [R]
        positions = anchor_pos.unsqueeze(-1) + torch.arange(self.block_size, device=device)  # [R, K]
        cos, sin = draft_rope(self.dims, positions)  # [R, K, hd]
        mask = padded_context_mask(lengths, kv.shape[4], self.block_size, self.block_size)
        h = self.block_embeddings(anchors).to(kv.dtype)  # [R, K, H]
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, kv[i, 0], kv[i, 1], mask)
        return self.norm(h)

    def prepare(
        self, states: list[SequenceState], sampling: list[SamplingParams]
    ) -> list[torch.Generator | None]:
        """Create missing caches, absorb new features; returns the per-request generators."""
        return sync_requests(self, states, sampling)

    def update(self, state: SequenceState, num_accepted: int, new_features: Tensor | None) -> None:
        """Absorb a verified round: extend the context cache from ``state.features``.

        ``state.features`` is the source of truth (the loop has already appended
        ``new_features`` to it); the cache held no drafts, so nothing is rolled back.
        """
        if state.drafter_cache is not None:
            self.sync_context(state)


def hold_backbone(owner: nn.Module, config, dims: DecoderDims) -> DFlashBackbone:
    """Build the backbone ``config`` describes and hold it as ``owner.backbone`` (:func:`hold`).

    ``owner`` gets the backbone's facts of the drafter protocol: ``dims``, ``block_size``,
    ``target_layer_ids`` and ``mask_token_id``.
    """
    backbone = DFlashBackbone(
        dims,
        num_layers=config.num_layers,
        block_size=config.block_size,
        target_layer_ids=config.target_layer_ids,
        mask_token_id=config.mask_token_id,
        mask_embedding=config.mask_embedding,
        draft_vocab_size=config.draft_vocab_size,
    )
    hold(owner, "backbone", backbone)
    owner.dims = backbone.dims
    owner.block_size = backbone.block_size
    owner.target_layer_ids = backbone.target_layer_ids
    owner.mask_token_id = backbone.mask_token_id
    return backbone


class BackboneDrafter:
    """What DFlash and DSpark share as drafters of the engine: the traits of a backbone holder
    (lazy: the context cache catches up when the drafter next proposes)."""

    @property
    def traits(self) -> DrafterTraits:
        # trained with the prompt's last token as an anchor too: then it drafts a request's first round
        return DrafterTraits(after_prompt=self.config.prompt_end_anchors, lazy=True)

    def pending(self, state: SequenceState) -> int:
        """Committed tokens whose features the context cache has not absorbed yet."""
        return pending_tokens(state)

    def catch_up(self, states: list[SequenceState], sampling: list[SamplingParams]) -> None:
        """Absorb them now (creates a request's cache on its first proposal)."""
        self.backbone.prepare(states, sampling)
