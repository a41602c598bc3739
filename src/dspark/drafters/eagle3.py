"""Eagle3: an autoregressive drafter trained with training-time test (DESIGN §5.2).

Entries and positions. Entry ``p`` pairs token ``x_p`` with a hidden state of position
``p - 1``: the fused target features ``g_{p-1} = fc([H^(l1); …; H^(lm)])`` for committed
tokens, or the drafter's own output for drafted ones. The single decoder layer reads
``[input_layernorm(embed(x_p)) ; hidden_norm(h_{p-1})]`` (width 2H) and its output at
entry p predicts ``x_{p+1}`` through ``lm_head(norm(·))``.

Inference (chain drafting, one forward per draft): step 1 is the anchor's entry
``(x_a, g_{a-1})`` at position a; step k ≥ 2 is ``(x_{a+k-1}, h^{(k-1)})`` at position
``a+k-1``, fed the previous step's output. Every step attends to the cached entries of
the committed context (positions 1..a-1), the steps before it, and itself. Context
entries depend only on committed tokens and features, so the cache grows each round
and never holds drafts.

Training-time test: the same chains, rooted at A anchors per sequence, for γ steps with
teacher-forced tokens; step k's loss weight is ``0.8^k`` against the full target
distribution (soft cross-entropy).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from dspark.drafters.attention import PackedBlockMask
from dspark.drafters.blocks import batch_layout, pack_blocks
from dspark.drafters.common import (
    DecoderDims,
    DraftAttention,
    RMSNorm,
    SwiGLU,
    build_from_target,
    draft_rope,
    fuse_features,
    init_weights,
    lm_logits,
    scaled_embedding,
    slot_factors,
)
from dspark.drafters.draft_vocab import register_draft_vocab
from dspark.drafters.objective_config import ObjectiveConfig, eagle3_objective
from dspark.drafters.request_state import (
    assert_states,
    batch_context,
    draw_drafts,
    padded_context_mask,
    pending_tokens,
    sync_requests,
)
from dspark.protocols import DraftBlock, DrafterTraits, SamplingParams, SequenceState, TrainBatch, TrainOutput


@dataclass(frozen=True, kw_only=True)
class Eagle3Config:
    """An Eagle3 drafter (one decoder layer; the full target vocabulary or Eagle3's reduced one)."""

    block_size: int = 7  # drafts per round = training-time-test length
    target_layer_ids: tuple[int, ...] | None = None  # None = the target adapter's
    draft_vocab_size: int | None = None  # N most frequent training tokens (d2t); None = all
    # trained with the prompt's last token as an anchor too (TrainConfig.prompt_end_anchors):
    # then it drafts a request's first round (DrafterTraits.after_prompt)
    prompt_end_anchors: bool = False
    objective: ObjectiveConfig = field(default_factory=eagle3_objective)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")


class Eagle3Layer(nn.Module):
    """The decoder layer over ``[norm(embed(x)) ; norm(h)]``; residual stream = h."""

    def __init__(self, dims: DecoderDims) -> None:
        super().__init__()
        H = dims.hidden_size
        self.hidden_norm = RMSNorm(H, dims.rms_norm_eps)
        self.input_layernorm = RMSNorm(H, dims.rms_norm_eps)
        self.self_attn = DraftAttention(dims, 2 * H, qk_norm=False)
        self.post_attention_layernorm = RMSNorm(H, dims.rms_norm_eps)
        self.mlp = SwiGLU(H, dims.intermediate_size, dims.activation)

    def entry_input(self, emb: Tensor, h: Tensor) -> Tensor:
        """``[input_layernorm(e) ; hidden_norm(h)]``: ``[..., H] x 2 → [..., 2H]``."""
        return torch.cat([self.input_layernorm(emb), self.hidden_norm(h)], dim=-1)

    def forward(
        self,
        emb: Tensor,
        h: Tensor,
        cos: Tensor,
        sin: Tensor,
        ctx_k: Tensor | None,
        ctx_v: Tensor | None,
        mask: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Entries ``(emb, h)`` ``[B, T, H]`` → outputs ``[B, T, H]`` and their k, v ``[B, nkv, T, hd]``."""
        attn, k, v = self.self_attn(self.entry_input(emb, h), cos, sin, ctx_k, ctx_v, mask)
        out = h + attn
        return out + self.mlp(self.post_attention_layernorm(out)), k, v


class Eagle3Drafter(nn.Module):
    """Eagle3; attribute names give the keys of DESIGN §5.4 (``layers.0.hidden_norm`` etc.)."""

    @property
    def traits(self) -> DrafterTraits:
        # a forward per draft (chain), lazy; with prompt-end anchors it drafts the first round
        return DrafterTraits(after_prompt=self.config.prompt_end_anchors, lazy=True, chain=True)

    def pending(self, state: SequenceState) -> int:  # protocols.LazyDrafter
        return pending_tokens(state)

    def catch_up(self, states: list[SequenceState], sampling: list[SamplingParams]) -> None:
        sync_requests(self, states, sampling)

    def __init__(self, config: Eagle3Config, dims: DecoderDims) -> None:
        super().__init__()
        if config.target_layer_ids is None:
            raise ValueError("target_layer_ids must be set (from_target fills it)")
        self.config = config
        self.dims = dims
        self.block_size = config.block_size
        self.target_layer_ids = tuple(config.target_layer_ids)
        H, V, L = dims.hidden_size, dims.vocab_size, len(self.target_layer_ids)
        N = register_draft_vocab(self, config.draft_vocab_size, V)  # the LM head's rows
        self.embed_tokens = nn.Embedding(V, H)
        self.fc = nn.Linear(L * H, H, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(dims)])
        self.norm = RMSNorm(H, dims.rms_norm_eps)
        self.lm_head = nn.Linear(H, N, bias=False)
        init_weights(self, dims.initializer_range)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    @classmethod
    def from_target(cls, target, config: Eagle3Config, *, draft_ids: Tensor | None = None) -> Eagle3Drafter:
        """A randomly initialised drafter for ``target`` sharing its (frozen) embedding and LM head
        (``draft_ids``: the reduced draft vocabulary of ``config.draft_vocab_size`` tokens)."""
        return build_from_target(cls, target, config, draft_ids=draft_ids)

    @property
    def layer(self) -> Eagle3Layer:
        return self.layers[0]

    def embed(self, ids: Tensor) -> Tensor:
        return scaled_embedding(self.embed_tokens, ids, self.dims)

    def logits(self, h: Tensor) -> Tensor:
        """``lm_head(norm(h))`` fp32: ``[..., H] → [..., N]`` (N = V unless reduced)."""
        return lm_logits(self.lm_head, self.norm(h), self.dims.logit_softcap)

    # -- training ----------------------------------------------------------------------------

    def forward_train(self, batch: TrainBatch) -> TrainOutput:
        """Training-time test: γ chained steps from each real anchor ``[1, N, K]`` (DESIGN §5.2).

        The first-pass entries (entry t = token x_{t+1} with g_t) and the blocks are packed
        as in :meth:`DFlashBackbone.block_hidden_train`: no padding blocks, attention per row.
        """
        ids = batch.input_ids
        T = ids.shape[1]
        blocks = pack_blocks(batch_layout(batch, self.block_size), T - 1)
        rows, anchors = blocks.rows, blocks.anchors  # [N]
        e_rows, e_pos = blocks.ctx_rows, blocks.ctx_positions  # [C]: entry t of row r
        g_ctx = fuse_features(self.fc, batch.features[e_rows, e_pos])  # [C, H]: g_t
        x_ctx = self.layer.entry_input(self.embed(ids[e_rows, e_pos + 1]).to(g_ctx.dtype), g_ctx)  # [C, 2H]
        cos_c, sin_c = draft_rope(self.dims, (e_pos + 1).unsqueeze(0))  # [1, C, hd]
        ctx_k, ctx_v = self.layer.self_attn.project_kv(x_ctx.unsqueeze(0), cos_c, sin_c)  # [1, nkv, C, hd]

        root = anchors.clamp_min(1)  # [N]; a chain needs g_{a-1}, so anchor 0 is unusable
        h = fuse_features(self.fc, batch.features[rows, root - 1]).unsqueeze(0)  # [1, N, H]: g_{a-1}
        spans = blocks.row_spans()
        chain_k: list[Tensor] = []
        chain_v: list[Tensor] = []
        outputs = []
        for k in range(self.block_size):
            tok = ids[rows, (root + k).clamp_max(T - 1)].unsqueeze(0)  # [1, N]: x_{a+k}, teacher-forced
            cos, sin = draft_rope(self.dims, (root + k).unsqueeze(0))  # [1, N, hd]
            # Step 0 is the anchor's own first-pass entry: it sees the entries before it
            # (t < a-1) and itself; later steps see the context up to the anchor (t < a),
            # the earlier steps of their own chain and themselves.
            visible = blocks.context_mask(anchors - 1 if k == 0 else anchors).unsqueeze(0)  # [1, N, C]
            prefix = (
                (torch.stack(chain_k, 3), torch.stack(chain_v, 3)) if chain_k else None
            )  # [1, nkv, N, P, hd]
            mask = PackedBlockMask(visible, 1, spans, prefix)
            h, k_new, v_new = self.layer(self.embed(tok).to(g_ctx.dtype), h, cos, sin, ctx_k, ctx_v, mask)
            if k > 0:  # step 0's keys are already the anchor's first-pass entry
                chain_k.append(k_new)  # [1, nkv, N, hd]
                chain_v.append(v_new)
            outputs.append(h)
        hidden = self.norm(torch.stack(outputs, dim=2))  # [1, N, K, H], final-normed
        softcap = self.dims.logit_softcap
        return TrainOutput(
            labels=blocks.labels.unsqueeze(0),
            valid=(blocks.valid & (anchors >= 1).unsqueeze(-1)).unsqueeze(0),
            factors=slot_factors(
                self.lm_head,
                hidden,
                batch.target_hidden,
                blocks.positions,
                softcap,
                rows=rows,
                draft_ids=self.draft_ids,
                full_head=self.full_head,
            ),
        )

    # -- inference ---------------------------------------------------------------------------

    @torch.no_grad()
    def sync_context(self, state: SequenceState) -> None:
        """Cache the first-pass entries of positions 1..a-1 (everything before the anchor a)."""
        context = state.drafter_cache.context
        start, end = context.length + 1, len(state.token_ids) - 1  # positions [start, end)
        if start >= end:
            return
        w = self.fc.weight
        ids = torch.tensor(state.token_ids[start:end], device=w.device).unsqueeze(0)  # [1, n]
        g = fuse_features(self.fc, state.features[start - 1 : end - 1].to(w.device)).unsqueeze(0)  # [1, n, H]
        cos, sin = draft_rope(self.dims, torch.arange(start, end, device=w.device).unsqueeze(0))  # [1, n, hd]
        k, v = self.layer.self_attn.project_kv(
            self.layer.entry_input(self.embed(ids).to(g.dtype), g), cos, sin
        )
        context.append(torch.stack([k, v]).squeeze(1).unsqueeze(0))  # [1, 2, nkv, n, hd]

    def update(self, state: SequenceState, num_accepted: int, new_features: Tensor | None) -> None:
        """Absorb a verified round; ``state.features`` already holds the new features."""
        if state.drafter_cache is not None:
            self.sync_context(state)

    @torch.no_grad()
    def propose(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams]
    ) -> DraftBlock:
        """Chain drafting: ``min(max_len, γ)`` forwards of the layer, each sampling one token."""
        assert_states(states, max_len, sampling)
        K = min(max_len, self.block_size)
        R = len(states)
        if K == 0 or R == 0:
            return DraftBlock.empty(R, self.dims.vocab_size)
        if min(len(s.token_ids) for s in states) < 2:
            raise ValueError("Eagle3 needs one committed token before the anchor")
        generators = sync_requests(self, states, sampling)
        kv, lengths = batch_context([s.drafter_cache.context for s in states])  # [1, 2, R, nkv, C, hd]
        device = kv.device
        anchor_pos = torch.tensor([len(s.token_ids) - 1 for s in states], device=device)  # [R]
        tok = torch.tensor([s.token_ids[-1] for s in states], device=device)  # [R]
        feats = torch.stack([s.features[len(s.token_ids) - 2] for s in states]).to(device)  # [R, L, H]
        h = fuse_features(self.fc, feats).unsqueeze(1)  # [R, 1, H]: g_{a-1}
        keys, values = [kv[0, 0]], [kv[0, 1]]
        tokens, probs = [], []
        for k in range(K):
            cos, sin = draft_rope(self.dims, (anchor_pos + k).unsqueeze(-1))  # [R, 1, hd]
            mask = padded_context_mask(lengths, kv.shape[4], 1, k + 1)  # own chain + itself
            h, k_new, v_new = self.layer(
                self.embed(tok).unsqueeze(1).to(h.dtype),
                h,
                cos,
                sin,
                torch.cat(keys, 2),
                torch.cat(values, 2),
                mask,
            )
            keys.append(k_new)
            values.append(v_new)
            # target ids (the next step embeds them) [R]; p_d [R, V] (None: all greedy)
            tok, p_k = draw_drafts(
                self.logits(h)[:, 0], sampling, generators, self.draft_ids, self.dims.vocab_size
            )
            tokens.append(tok)
            probs.append(p_k)
        return DraftBlock(
            tokens=torch.stack(tokens, dim=-1),  # [R, K]
            lengths=torch.full((R,), K, dtype=torch.long, device=device),
            probs=None if probs[0] is None else torch.stack(probs, dim=1),  # [R, K, V]
        )
