"""Layers and helpers shared by the feature-conditioned drafters (DESIGN §5).

- :class:`DecoderDims`: the shape of a draft decoder layer, read from the target config;
- RMSNorm, SwiGLU (RoPE and attention are in :mod:`dspark.drafters.attention`);
- :class:`DraftAttention` / :class:`DraftDecoderLayer`: a Qwen3-style pre-norm layer with
  **KV injection** (paper Eq. 3): keys/values ``[W_K H_ctx ; W_K H_d]``, queries from the
  draft block only;
- the glue every drafter needs: resolving config fields against the target, copying the
  frozen embedding and LM head, the slots' logits as factors for the loss.

Per-request state (context K/V caches, generators, sampling) is in
:mod:`dspark.drafters.request_state`.

Module attribute names follow the DeepSpec checkpoint layout (DESIGN §5.4), so a drafter's
``state_dict()`` has the released key names without any renaming.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers.activations import ACT2FN

from dspark.drafters.attention import PackedBlockMask, apply_rope, attend, attend_packed_blocks, rope_cos_sin
from dspark.drafters.draft_vocab import check_draft_ids, set_full_head
from dspark.drafters.flex_blocks import attend_packed_blocks_flex
from dspark.drafters.mask import resolve_mask_id
from dspark.protocols import SlotFactors
from dspark.targets.families import layer_shape

# -- dimensions -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DecoderDims:
    """Shape of a draft decoder layer; drafters copy it from their target (DESIGN §5.1).

    ``embed_scale`` and ``logit_softcap`` are the target family's quirks (Gemma): the
    drafter holds the bare embedding matrix and LM head, so it applies them itself.
    ``qk_norm`` and ``activation`` follow the family too (Qwen3-style defaults when built
    by hand).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    initializer_range: float = 0.02
    embed_scale: float = 1.0
    logit_softcap: float | None = None
    qk_norm: bool = True  # per-head q/k RMSNorm in DFlash/DSpark layers: only where the family has it
    activation: str = "silu"  # the gated MLP's activation, the family's (HF ACT2FN name)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @classmethod
    def from_target(cls, target) -> DecoderDims:
        """Dims of ``target`` (a :class:`~dspark.targets.TargetAdapter`), read through its
        family's row of :mod:`dspark.targets.families` (no Llama field names assumed)."""
        shape = layer_shape(target.config)
        return cls(
            vocab_size=target.vocab_size,
            hidden_size=shape.hidden_size,
            intermediate_size=shape.intermediate_size,
            num_heads=shape.num_heads,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            rms_norm_eps=shape.norm_eps,
            rope_theta=shape.rope_theta,
            initializer_range=shape.initializer_range,
            embed_scale=target.quirks.embed_scale,
            logit_softcap=target.quirks.final_logit_softcapping,
            qk_norm=target.quirks.has_qk_norm,
            activation=target.quirks.activation,
        )


# -- building blocks ----------------------------------------------------------------------


class RMSNorm(nn.Module):
    """``w · x / rms(x)``, computed in fp32 like the Qwen3/Llama reference."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class SwiGLU(nn.Module):
    """``down(act(gate(x)) * up(x))``; ``act`` = SiLU (SwiGLU) unless the family uses another."""

    def __init__(self, hidden: int, intermediate: int, activation: str = "silu") -> None:
        super().__init__()
        self.act = ACT2FN[activation]
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DraftAttention(nn.Module):
    """Multi-head attention whose keys/values may be prefixed by injected context.

    ``in_features`` is H for DFlash layers and 2H for Eagle3's layer (DESIGN §5.2);
    ``qk_norm`` adds Qwen3's per-head RMSNorm on queries and keys before RoPE.
    """

    def __init__(self, dims: DecoderDims, in_features: int, *, qk_norm: bool) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = dims.num_heads, dims.num_kv_heads, dims.head_dim
        self.q_proj = nn.Linear(in_features, dims.num_heads * dims.head_dim, bias=False)
        self.k_proj = nn.Linear(in_features, dims.num_kv_heads * dims.head_dim, bias=False)
        self.v_proj = nn.Linear(in_features, dims.num_kv_heads * dims.head_dim, bias=False)
        self.o_proj = nn.Linear(dims.num_heads * dims.head_dim, dims.hidden_size, bias=False)
        self.q_norm = RMSNorm(dims.head_dim, dims.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(dims.head_dim, dims.rms_norm_eps) if qk_norm else None

    def _heads(self, x: Tensor, n: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)  # [B, n, T, hd]

    def project_kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Keys (normed, rotated) and values of ``x [B, T, in]``: two ``[B, nkv, T, hd]``."""
        k = self._heads(self.k_proj(x), self.num_kv_heads)  # [B, nkv, T, hd]
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rope(k, cos, sin), self._heads(self.v_proj(x), self.num_kv_heads)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        ctx_k: Tensor | None,
        ctx_v: Tensor | None,
        mask: Tensor | PackedBlockMask | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Attend from ``x [B, T, in]`` over ``[ctx ; x]``; returns out ``[B, T, H]`` and x's k, v.

        ``ctx_k``/``ctx_v`` ``[B, nkv, C, hd]`` are already rotated; ``mask`` is
        ``[B, 1, T, C + T]`` bool, None, or a :class:`PackedBlockMask` (training's packed blocks).
        """
        B, T, _ = x.shape
        q = self._heads(self.q_proj(x), self.num_heads)  # [B, nh, T, hd]
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = apply_rope(q, cos, sin)
        k, v = self.project_kv(x, cos, sin)  # [B, nkv, T, hd]
        if isinstance(mask, PackedBlockMask):
            packed = attend_packed_blocks if mask.flex_mask is None else attend_packed_blocks_flex
            out = packed(q, ctx_k, ctx_v, k, v, mask)  # [B, nh, T, hd]
        else:
            keys = k if ctx_k is None else torch.cat([ctx_k, k], dim=2)  # [B, nkv, C+T, hd]
            values = v if ctx_v is None else torch.cat([ctx_v, v], dim=2)
            out = attend(q, keys, values, mask)  # [B, nh, T, hd]
        out = out.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)  # [B, T, nh*hd]
        return self.o_proj(out), k, v


class DraftDecoderLayer(nn.Module):
    """Pre-norm decoder layer with KV injection (paper Eq. 3, DESIGN §5.1).

    Qwen3's shape; q/k-norm and the MLP activation as the target family has them.

    The context is not run through the layer: its fused features ``H_ctx`` are only
    projected by this layer's ``k_proj``/``v_proj`` (k-norm and RoPE included) and
    prepended to the block's own keys and values.
    """

    def __init__(self, dims: DecoderDims) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(dims.hidden_size, dims.rms_norm_eps)
        self.self_attn = DraftAttention(dims, dims.hidden_size, qk_norm=dims.qk_norm)
        self.post_attention_layernorm = RMSNorm(dims.hidden_size, dims.rms_norm_eps)
        self.mlp = SwiGLU(dims.hidden_size, dims.intermediate_size, dims.activation)

    def context_kv(self, h_ctx: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """``W_K H_ctx``, ``W_V H_ctx`` for context ``[B, C, H]``: two ``[B, nkv, C, hd]``."""
        return self.self_attn.project_kv(h_ctx, cos, sin)

    def forward(
        self,
        h: Tensor,
        cos: Tensor,
        sin: Tensor,
        ctx_k: Tensor | None,
        ctx_v: Tensor | None,
        mask: Tensor | PackedBlockMask | None,
    ) -> Tensor:
        """Block hidden states ``[B, T, H]`` → ``[B, T, H]``."""
        attn, _, _ = self.self_attn(self.input_layernorm(h), cos, sin, ctx_k, ctx_v, mask)
        h = h + attn
        return h + self.mlp(self.post_attention_layernorm(h))


def fuse_features(fc: nn.Linear, features: Tensor) -> Tensor:
    """``W_c [H^(l1); …; H^(lm)]``: features ``[..., L, H]`` → ``[..., H]`` (paper Eq. 2, before the norm)."""
    return fc(features.flatten(-2).to(fc.weight.dtype))


def init_weights(module: nn.Module, std: float) -> None:
    """HF-style init: linear and embedding weights ~ N(0, std), biases 0, norms 1."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
        elif isinstance(m, RMSNorm):
            nn.init.ones_(m.weight)


# -- the target's shared pieces ---------------------------------------------------------


def resolve_target_fields(config, target, *, own_layers: bool = False):
    """``config`` with ``target_layer_ids`` and ``mask_token_id`` filled in from ``target``.

    ``None`` means "the target's": its adapter's default feature layers, its tokenizer's
    mask token (:mod:`dspark.drafters.mask` when it has none). For a drafter about to be
    trained, given layers must agree with the adapter, whose default forward produces
    the training features (fail loudly rather than train on the wrong layers). A trained
    drafter (``own_layers``, from its folder) keeps its own layers, checked to exist:
    inference passes them to every forward.
    """
    changes = {}
    if hasattr(config, "target_layer_ids"):
        ids = config.target_layer_ids
        if ids is None:
            changes["target_layer_ids"] = tuple(target.target_layer_ids)
        elif own_layers:
            target.feature_layers(ids)  # raises ValueError naming ids the target lacks
        elif tuple(ids) != tuple(target.target_layer_ids):
            raise ValueError(
                f"drafter target_layer_ids {tuple(ids)} != the adapter's {tuple(target.target_layer_ids)}: "
                "build the TargetAdapter with target_layer_ids=... to match"
            )
    if hasattr(config, "mask_token_id"):
        changes["mask_token_id"] = resolve_mask_id(config, target)
    return dataclasses.replace(config, **changes)


@torch.no_grad()
def set_draft_ids(drafter: nn.Module, ids: Tensor, target) -> None:
    """Choose the draft vocabulary ``ids [N]`` of a reduced-vocabulary drafter; its head follows."""
    check_draft_ids(ids, target.vocab_size)
    if drafter.draft_ids is None or ids.numel() != drafter.draft_ids.numel():
        raise ValueError(f"drafter has no draft vocabulary of {ids.numel()} tokens")
    drafter.draft_ids.copy_(ids)
    copy_shared_weights(drafter, target)


@torch.no_grad()
def copy_shared_weights(drafter: nn.Module, target, *, init_mask: bool = True) -> None:
    """Copy the target's embedding and LM head into ``drafter`` and freeze them (DESIGN §2).

    A reduced draft vocabulary takes the head's rows of its ``draft_ids`` and keeps the
    full head as ``full_head`` for the training loss. A learned mask embedding starts at
    the mean embedding row (a neutral input) unless ``init_mask`` is False (a load).
    """
    embedding = target.model.get_input_embeddings().weight
    head = target.model.get_output_embeddings().weight
    ids = getattr(drafter, "draft_ids", None)
    if ids is not None:
        set_full_head(drafter, head.detach())  # [V, H], shared storage, not saved
        head = head[ids.to(head.device)]  # [N, H]
    for name, source in (("embed_tokens", embedding), ("lm_head", head)):
        param = getattr(drafter, name).weight
        if param.shape != source.shape:
            raise ValueError(f"{name} {tuple(param.shape)} != target's {tuple(source.shape)}")
        param.copy_(source)
        param.requires_grad_(False)
    mask = getattr(drafter, "mask_embedding", None)
    if mask is not None and init_mask:
        mask.copy_(embedding.mean(dim=0))


def lm_logits(lm_head: nn.Linear, h: Tensor, softcap: float | None) -> Tensor:
    """Logits ``[..., V]`` fp32 from final-normed ``h [..., H]``, with the family's softcap."""
    logits = lm_head(h).float()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return logits


def slot_factors(
    lm_head: nn.Linear,
    hidden: Tensor,
    target_hidden: Tensor,
    positions: Tensor,
    softcap: float | None,
    *,
    rows: Tensor | None = None,
    low_rank: tuple[Tensor, Tensor] | None = None,
    draft_ids: Tensor | None = None,
    full_head: Tensor | None = None,
) -> SlotFactors:
    """The draft and target logits of every slot as :class:`~dspark.protocols.SlotFactors` (DESIGN §6).

    ``hidden [..., K, H]`` are the slots' final-normed draft states; ``target_hidden
    [B, T, H]`` the target's final-normed last hidden state; ``positions [B, A, K]`` the
    slots' positions (clamped to T - 1), or ``[N, K]`` with ``rows [N]`` naming each
    block's batch row; ``low_rank`` the sequential head's ``(u [..., K, r], W_2ᵀ [V, r])``;
    ``draft_ids`` / ``full_head`` a reduced draft vocabulary's ids and the target's full head.
    Blocks overlap — slot k of anchor a and slot k - 1 of anchor a + 1 sit at one
    position — so the target's rows are kept once per distinct position.
    """
    B, T, H = target_hidden.shape
    if rows is None:
        rows = torch.arange(B, device=positions.device).view(B, 1).expand(positions.shape[:-1])
    flat = (rows.unsqueeze(-1) * T + positions.clamp_max(T - 1)).reshape(-1)  # [slots]
    distinct, inverse = torch.unique(flat, return_inverse=True)  # [U], [slots]
    u, w2 = low_rank if low_rank is not None else (None, None)
    return SlotFactors(
        hidden=hidden,
        head=lm_head.weight,
        target_rows=target_hidden.reshape(B * T, H)[distinct],  # [U, H]
        target_index=inverse.view(hidden.shape[:-1]),
        softcap=softcap,
        low_rank_u=u,
        low_rank_w=w2,
        draft_ids=draft_ids,
        target_head=_full_head(draft_ids, full_head),
    )


def _full_head(draft_ids: Tensor | None, full_head: Tensor | None) -> Tensor | None:
    if draft_ids is not None and full_head is None:
        raise ValueError(
            "a reduced-vocabulary drafter trains against the target's full LM head: "
            "build it with from_target (or copy_shared_weights) first"
        )
    return full_head if draft_ids is not None else None


def scaled_embedding(embed_tokens: nn.Embedding, ids: Tensor, dims: DecoderDims) -> Tensor:
    """Token embeddings ``[...] → [..., H]``, scaled like the target's (Gemma's √H)."""
    e = embed_tokens(ids)
    return e * dims.embed_scale if dims.embed_scale != 1.0 else e


def draft_rope(dims: DecoderDims, positions: Tensor) -> tuple[Tensor, Tensor]:
    """The draft layers' RoPE ``cos, sin [..., hd]`` at ``positions [...]``."""
    return rope_cos_sin(positions, dims.head_dim, dims.rope_theta)


def drafter_dims(target, config) -> DecoderDims:
    """The target's dims with the config's draft-layer choices (``qk_norm``) over the family's."""
    dims = DecoderDims.from_target(target)
    if getattr(config, "qk_norm", None) is not None:
        dims = dataclasses.replace(dims, qk_norm=bool(config.qk_norm))
    return dims


def build_from_target(cls, target, config, *, own_layers: bool = False, draft_ids: Tensor | None = None):
    """``cls(config, dims)`` for ``target``: fields resolved (``own_layers``: see
    :func:`resolve_target_fields`), embedding and LM head copied, on its device.

    ``draft_ids`` choose a reduced draft vocabulary (``config.draft_vocab_size`` tokens;
    a drafter being loaded gets them from its checkpoint instead).
    """
    config = resolve_target_fields(config, target, own_layers=own_layers)
    drafter = cls(config, drafter_dims(target, config))
    if draft_ids is not None:
        set_draft_ids(drafter, draft_ids.to(torch.long), target)
    else:
        copy_shared_weights(drafter, target)
    return drafter.to(device=target.device, dtype=target.dtype)
