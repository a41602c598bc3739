"""Per-family layout and quirks of target models, as data (DESIGN §4).

The adapter is one class for every HF causal LM; what differs between families is
where the pieces live (embedding, decoder layers, final norm, LM head), which config
fields hold the dimensions, and a handful of numbers and flags. All of it is looked up
here from ``config.model_type``, never guessed from attributes. A drafter that shares
the target's embedding and LM head (DESIGN §2), or copies its layer shape, reads the same
record, so both sides apply e.g. Gemma's embedding scale the same way.

Adding a family = adding one row to ``_FAMILIES``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from dspark.errors import UnsupportedTargetError


@dataclass(frozen=True, kw_only=True)
class FamilyQuirks:
    """What a consumer of the raw target weights must know, resolved for one config.

    ``embed_scale``: factor on the rows of the embedding matrix (Gemma: sqrt(H)); HF
    Gemma applies it inside its embedding module, a drafter holding the bare matrix
    must apply it itself.
    ``final_logit_softcapping``: ``logits = c * tanh(logits / c)`` after the LM head
    (Gemma2; Gemma3 when set in the config); None = off.
    ``has_qk_norm``: RMSNorm on per-head queries and keys before RoPE (Qwen3, Gemma3);
    a draft layer follows the family and has it only then.
    ``activation``: the MLP activation (an HF ``ACT2FN`` name); draft layers use it in
    their gated MLP.
    """

    family: str
    embed_scale: float = 1.0
    final_logit_softcapping: float | None = None
    has_qk_norm: bool = False
    activation: str = "silu"


@dataclass(frozen=True, kw_only=True)
class FamilyLayout:
    """Where one family keeps its pieces and its dimensions.

    Module paths are dotted attribute paths from the ``*ForCausalLM`` model; config
    names are fields of its (text) config. ``intermediate`` may be absent from a config
    (GPT-2's ``n_inner = None``), then it is ``4 * hidden_size``.
    """

    decoder: str = "model"  # the base model: embeddings -> layers -> final norm
    embedding: str = "model.embed_tokens"
    layers: str = "model.layers"
    final_norm: str = "model.norm"
    lm_head: str = "lm_head"
    intermediate: str = "intermediate_size"
    norm_eps: str = "rms_norm_eps"
    activation: str = "hidden_act"
    scaled_embedding: bool = False  # embed_scale = sqrt(hidden_size)
    has_qk_norm: bool = False


_LLAMA = FamilyLayout()
_GEMMA = FamilyLayout(activation="hidden_activation", scaled_embedding=True)
_FAMILIES: dict[str, FamilyLayout] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "phi3": _LLAMA,  # fused qkv / gate-up projections, same module tree
    "qwen3": FamilyLayout(has_qk_norm=True),
    "gemma": _GEMMA,
    "gemma2": _GEMMA,
    "gemma3_text": FamilyLayout(activation="hidden_activation", scaled_embedding=True, has_qk_norm=True),
    "gpt2": FamilyLayout(
        decoder="transformer",
        embedding="transformer.wte",
        layers="transformer.h",
        final_norm="transformer.ln_f",
        intermediate="n_inner",
        norm_eps="layer_norm_epsilon",
        activation="activation_function",
    ),
    "gpt_neox": FamilyLayout(
        decoder="gpt_neox",
        embedding="gpt_neox.embed_in",
        layers="gpt_neox.layers",
        final_norm="gpt_neox.final_layer_norm",
        norm_eps="layer_norm_eps",
    ),
}
SUPPORTED_FAMILIES = tuple(_FAMILIES)


def layout_for(config) -> FamilyLayout:
    """The layout row of ``config.model_type``; an unknown type is a one-line user error."""
    family = config.model_type
    layout = _FAMILIES.get(family)
    if layout is None:
        raise UnsupportedTargetError(
            f"unsupported target model type {family!r}: dspark knows the layouts of "
            f"{', '.join(SUPPORTED_FAMILIES)} (add a row to dspark/targets/families.py)"
        )
    return layout


def quirks_for(config) -> FamilyQuirks:
    """The quirks of the target described by ``config`` (an HF ``PretrainedConfig``).

    The logit softcap is read from the config for every family (Gemma2 sets it, Gemma3
    may; the attribute does not exist elsewhere).
    """
    layout = layout_for(config)
    softcap = getattr(config, "final_logit_softcapping", None)
    return FamilyQuirks(
        family=config.model_type,
        embed_scale=float(config.hidden_size) ** 0.5 if layout.scaled_embedding else 1.0,
        final_logit_softcapping=float(softcap) if softcap else None,
        has_qk_norm=layout.has_qk_norm,
        activation=str(getattr(config, layout.activation, None) or "silu"),
    )


@dataclass(frozen=True, kw_only=True)
class LayerShape:
    """The attention/MLP shape of one target decoder layer, whatever the config calls it."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm_eps: float
    rope_theta: float  # 10000 for families without RoPE (GPT-2): the draft layers' own RoPE
    initializer_range: float


def layer_shape(config) -> LayerShape:
    """Read :class:`LayerShape` from ``config`` through its family's field names.

    ``hidden_size`` and ``num_attention_heads`` are standard HF names (GPT-2 maps them
    onto ``n_embd`` / ``n_head`` itself); the rest go through the layout row.
    """
    layout = layout_for(config)
    hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta or getattr(config, "rope_theta", None) or getattr(config, "rotary_emb_base", None) or 1e4
    return LayerShape(
        hidden_size=hidden,
        intermediate_size=int(getattr(config, layout.intermediate, None) or 4 * hidden),
        num_heads=heads,
        num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
        norm_eps=float(getattr(config, layout.norm_eps, None) or 1e-6),
        rope_theta=float(theta),
        initializer_range=float(getattr(config, "initializer_range", None) or 0.02),
    )


def module_at(model, path: str):
    """The submodule at dotted ``path`` of ``model``, or a one-line error naming the type."""
    try:
        return functools.reduce(getattr, path.split("."), model)
    except AttributeError:
        raise UnsupportedTargetError(
            f"target model type {model.config.model_type!r} ({type(model).__name__}) has no {path!r}: "
            "its layout differs from dspark's table (dspark/targets/families.py)"
        ) from None
