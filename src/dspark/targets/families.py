"""Per-family quirks of target models, as data (SPEC §4).

The adapter is one class for every HF causal LM; what differs between families is a
handful of numbers and flags, looked up here from ``config.model_type``. A drafter that
shares the target's embedding and LM head (SPEC §2) reads the same record, so both sides
apply e.g. Gemma's embedding scale the same way.

Adding a family = adding one row to ``_FAMILIES``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class FamilyQuirks:
    """What a consumer of the raw target weights must know, resolved for one config.

    ``embed_scale``: factor on the rows of ``embed_tokens.weight`` (Gemma: sqrt(H));
    HF Gemma applies it inside its embedding module, a drafter holding the bare matrix
    must apply it itself.
    ``final_logit_softcapping``: ``logits = c * tanh(logits / c)`` after the LM head
    (Gemma2; Gemma3 when set in the config); None = off.
    ``has_qk_norm``: RMSNorm on per-head queries and keys before RoPE (Qwen3, Gemma3);
    a drafter layer copied from the target's architecture needs it too.
    """

    family: str
    embed_scale: float = 1.0
    final_logit_softcapping: float | None = None
    has_qk_norm: bool = False


@dataclass(frozen=True)
class _FamilyRule:
    """How to resolve :class:`FamilyQuirks` from a config of one ``model_type``."""

    scaled_embedding: bool = False  # embed_scale = sqrt(hidden_size)
    has_qk_norm: bool = False


_FAMILIES: dict[str, _FamilyRule] = {
    "llama": _FamilyRule(),
    "mistral": _FamilyRule(),
    "qwen2": _FamilyRule(),
    "qwen3": _FamilyRule(has_qk_norm=True),
    "gemma": _FamilyRule(scaled_embedding=True),
    "gemma2": _FamilyRule(scaled_embedding=True),
    "gemma3_text": _FamilyRule(scaled_embedding=True, has_qk_norm=True),
}


def quirks_for(config) -> FamilyQuirks:
    """The quirks of the target described by ``config`` (an HF ``PretrainedConfig``).

    The logit softcap is read from the config for every family (Gemma2 sets it, Gemma3
    may; the attribute does not exist elsewhere). Unknown families get the Llama
    defaults with a warning; the adapter then checks the embedding scale against the
    model itself and fails loudly if the guess is wrong.
    """
    family = config.model_type
    rule = _FAMILIES.get(family)
    if rule is None:
        logger.warning("unknown target family %r: assuming Llama-like quirks", family)
        rule = _FamilyRule()
    softcap = getattr(config, "final_logit_softcapping", None)
    return FamilyQuirks(
        family=family,
        embed_scale=float(config.hidden_size) ** 0.5 if rule.scaled_embedding else 1.0,
        final_logit_softcapping=float(softcap) if softcap else None,
        has_qk_norm=rule.has_qk_norm,
    )
