"""Layers and helpers shared by the feature-conditioned drafters (SPEC §5).

- :class:`DecoderDims`: the shape of a draft decoder layer, read from the target config;
- RoPE, RMSNorm, SwiGLU, attention with an explicit boolean mask (SDPA);
- :class:`DraftAttention` / :class:`DraftDecoderLayer`: a Qwen3-style pre-norm layer with
  **KV injection** (paper Eq. 3): keys/values ``[W_K H_ctx ; W_K H_d]``, queries from the
  draft block only;
- :class:`ContextKV`: a per-request, growable cache of context keys/values;
- the glue every drafter needs: resolving config fields against the target, copying the
  frozen embedding and LM head, per-request generators and sampling.

Module attribute names follow the DeepSpec checkpoint layout (SPEC §5.4), so a drafter's
``state_dict()`` has the released key names without any renaming.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.activations import ACT2FN

from dspark.drafters.mask import resolve_mask_id
from dspark.protocols import SamplingParams, SlotFactors
from dspark.targets.families import layer_shape

# -- dimensions -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DecoderDims:
    """Shape of a draft decoder layer; drafters copy it from their target (SPEC §5.1).

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
    every slot (bidirectional, SPEC §5.1); it never sees another block. ``spans`` (from
    :meth:`~dspark.drafters.blocks.PackedBlocks.row_spans`) lists ``(n0, n1, c0, c1)``:
    blocks ``n0:n1`` can only see context ``c0:c1`` (their batch row), so the scores
    outside those rectangles are never computed. ``prefix`` holds keys/values of earlier
    entries of each block that all its queries also see (Eagle3's chain so far).
    """

    context: Tensor  # [B, N, C] bool
    block_size: int  # queries per block
    spans: tuple[tuple[int, int, int, int], ...] | None = None
    prefix: tuple[Tensor, Tensor] | None = None  # keys, values [B, nkv, N, P, hd]


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

    ``in_features`` is H for DFlash layers and 2H for Eagle3's layer (SPEC §5.2);
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
            out = attend_packed_blocks(q, ctx_k, ctx_v, k, v, mask)  # [B, nh, T, hd]
        else:
            keys = k if ctx_k is None else torch.cat([ctx_k, k], dim=2)  # [B, nkv, C+T, hd]
            values = v if ctx_v is None else torch.cat([ctx_v, v], dim=2)
            out = attend(q, keys, values, mask)  # [B, nh, T, hd]
        out = out.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)  # [B, T, nh*hd]
        return self.o_proj(out), k, v


class DraftDecoderLayer(nn.Module):
    """Pre-norm decoder layer with KV injection (paper Eq. 3, SPEC §5.1).

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
def copy_shared_weights(drafter: nn.Module, target) -> None:
    """Copy the target's embedding and LM head into ``drafter`` and freeze them (SPEC §2).

    A learned mask embedding starts at the mean embedding row (a neutral input).
    """
    embedding = target.model.get_input_embeddings().weight
    head = target.model.get_output_embeddings().weight
    for name, source in (("embed_tokens", embedding), ("lm_head", head)):
        param = getattr(drafter, name).weight
        if param.shape != source.shape:
            raise ValueError(f"{name} {tuple(param.shape)} != target's {tuple(source.shape)}")
        param.copy_(source)
        param.requires_grad_(False)
    mask = getattr(drafter, "mask_embedding", None)
    if mask is not None:
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
) -> SlotFactors:
    """The draft and target logits of every slot as :class:`~dspark.protocols.SlotFactors` (SPEC §6).

    ``hidden [..., K, H]`` are the slots' final-normed draft states; ``target_hidden
    [B, T, H]`` the target's final-normed last hidden state; ``positions [B, A, K]`` the
    slots' positions (clamped to T - 1), or ``[N, K]`` with ``rows [N]`` naming each
    block's batch row; ``low_rank`` the sequential head's ``(u [..., K, r], W_2ᵀ [V, r])``.
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
    )


# -- inference state ------------------------------------------------------------------------


class ContextKV:
    """Keys/values of one request's context for every draft layer, grown in place.

    Holds ``[n_layers, 2, nkv, capacity, hd]`` and doubles the capacity when full, so
    absorbing a round's few new tokens never copies the whole context.
    """

    def __init__(self, n_layers: int, num_kv_heads: int, head_dim: int, *, dtype, device) -> None:
        self.buf = torch.zeros(n_layers, 2, num_kv_heads, 64, head_dim, dtype=dtype, device=device)
        self.length = 0

    def append(self, kv: Tensor) -> None:
        """Append ``kv [n_layers, 2, nkv, n, hd]`` for n new context entries."""
        n = kv.shape[3]
        need = self.length + n
        if need > self.buf.shape[3]:
            capacity = max(need, 2 * self.buf.shape[3])
            grown = self.buf.new_zeros(*self.buf.shape[:3], capacity, self.buf.shape[4])
            grown[..., : self.length, :] = self.buf[..., : self.length, :]
            self.buf = grown
        self.buf[..., self.length : need, :] = kv
        self.length = need

    def view(self) -> Tensor:
        """``[n_layers, 2, nkv, C, hd]`` for the C entries held."""
        return self.buf[..., : self.length, :]


@dataclass
class DrafterCache:
    """What a feature-conditioned drafter keeps per request in ``state.drafter_cache``."""

    context: ContextKV  # keys/values of the committed context, never of drafts
    generator: torch.Generator | None  # seeded from SamplingParams.seed, else None


def request_cache(
    state, params: SamplingParams, num_layers: int, dims: DecoderDims, like: Tensor
) -> DrafterCache:
    """``state.drafter_cache``, created on a request's first proposal: empty context K/V for
    ``num_layers`` draft layers (dtype and device of ``like``) and the request's generator."""
    if state.drafter_cache is None:
        context = ContextKV(
            num_layers, dims.num_kv_heads, dims.head_dim, dtype=like.dtype, device=like.device
        )
        state.drafter_cache = DrafterCache(context=context, generator=request_generator(params, like.device))
    return state.drafter_cache


def scaled_embedding(embed_tokens: nn.Embedding, ids: Tensor, dims: DecoderDims) -> Tensor:
    """Token embeddings ``[...] → [..., H]``, scaled like the target's (Gemma's √H)."""
    e = embed_tokens(ids)
    return e * dims.embed_scale if dims.embed_scale != 1.0 else e


def batch_context(caches: list[ContextKV]) -> tuple[Tensor, Tensor]:
    """R requests' context K/V right-padded, ``[n_layers, 2, R, nkv, Cmax, hd]``, and lengths ``[R]``."""
    views = [c.view() for c in caches]
    if len(views) == 1:
        return views[0].unsqueeze(2), torch.tensor([caches[0].length], device=views[0].device)
    n_layers, _, nkv, _, hd = views[0].shape
    c_max = max(c.length for c in caches)
    out = views[0].new_zeros(n_layers, 2, len(views), nkv, c_max, hd)
    for r, v in enumerate(views):
        out[:, :, r, :, : v.shape[3]] = v
    return out, torch.tensor([c.length for c in caches], device=out.device)


def padded_context_mask(lengths: Tensor, c_max: int, num_queries: int, num_own: int) -> Tensor | None:
    """``[R, 1, Tq, Cmax + own]`` bool: real context entries and all own keys; None if no padding."""
    if bool((lengths == c_max).all()):
        return None
    R = lengths.shape[0]
    ctx = torch.arange(c_max, device=lengths.device) < lengths.unsqueeze(-1)  # [R, Cmax]
    own = torch.ones(R, num_own, dtype=torch.bool, device=lengths.device)  # [R, own]
    return torch.cat([ctx, own], dim=-1)[:, None, None, :].expand(R, 1, num_queries, c_max + num_own)


def request_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """The drafter's own generator for one request: seeded from ``params.seed``, else None (global RNG)."""
    if params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(params.seed)


def sample_tokens(
    probs: Tensor, sampling: list[SamplingParams], generators: list[torch.Generator | None]
) -> Tensor:
    """One token per row of ``probs [R, V]`` or ``[R, K, V]``: argmax if greedy, else a draw.

    Request r draws from its own generator, so its drafts depend on its own seed only. A
    row that is not a distribution (NaN/inf, no mass: a corrupt drafter) is not drawn
    from; it keeps its argmax and the caller (the engine) fails that request on its probs.
    """
    if probs.dim() == 2:
        return sample_tokens(probs.unsqueeze(1), sampling, generators).squeeze(1)
    R, K, _ = probs.shape
    tokens = probs.argmax(dim=-1)  # [R, K]
    for r, (params, g) in enumerate(zip(sampling, generators)):
        if not params.greedy and K > 0:
            p = probs[r].float()  # [K, V]
            mass = p.sum(dim=-1)  # [K]; non-finite iff some entry is
            if bool((torch.isfinite(mass) & (mass > 0)).all()):
                tokens[r] = torch.multinomial(p, 1, generator=g).squeeze(-1)  # [K]
    return tokens


def assert_states(states, max_len: int, sampling) -> None:
    """Checks at the propose boundary, shared by every drafter."""
    assert len(sampling) == len(states), f"{len(sampling)} sampling params for {len(states)} states"
    assert max_len >= 0, f"max_len must be >= 0, got {max_len}"
    for s in states:
        n_feat = 0 if s.features is None else s.features.shape[0]
        if n_feat < len(s.token_ids) - 1:
            raise ValueError(
                f"request {s.request_id}: {n_feat} feature rows for {len(s.token_ids)} tokens "
                "(need one per token except the anchor)"
            )


def drafter_dims(target, config) -> DecoderDims:
    """The target's dims with the config's draft-layer choices (``qk_norm``) over the family's."""
    dims = DecoderDims.from_target(target)
    if getattr(config, "qk_norm", None) is not None:
        dims = dataclasses.replace(dims, qk_norm=bool(config.qk_norm))
    return dims


def build_from_target(cls, target, config, *, own_layers: bool = False):
    """``cls(config, dims)`` for ``target``: fields resolved (``own_layers``: see
    :func:`resolve_target_fields`), embedding and LM head copied, on its device."""
    config = resolve_target_fields(config, target, own_layers=own_layers)
    drafter = cls(config, drafter_dims(target, config))
    copy_shared_weights(drafter, target)
    return drafter.to(device=target.device, dtype=target.dtype)
