"""The registry's table of trainable drafter methods (DESIGN §5): config class, module
class, checkpoint architecture and the config.json fields of each. Nothing outside
this table and :mod:`dspark.drafters.registry` branches on a method name.

A trainable drafter is one file under ``drafters/`` plus one row of :data:`KINDS`. The
table names each drafter's module instead of importing it, so it costs no torch import:
``--help`` and argument checks list the methods straight from it
(:data:`dspark.drafters.registry.TRAINABLE`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark.errors import DsparkError

if TYPE_CHECKING:
    from dspark.drafters.dflash import DFlashConfig
    from dspark.drafters.dspark import DSparkConfig
    from dspark.drafters.eagle3 import Eagle3Config

DSPARK_ARCHITECTURES = ("Qwen3DSparkModel", "Gemma4DSparkModel", "LlamaDSparkModel")
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


@dataclass(frozen=True)
class DrafterKind:
    name: str
    module: str  # the drafter's file, e.g. "dspark.drafters.dspark"
    config_name: str  # its frozen config dataclass, in ``module``
    drafter_name: str  # its nn.Module, in ``module``
    architecture: str
    uses_mask_token: bool  # a block drafter: slots after the anchor take the mask input
    config_fields: Callable[..., dict[str, Any]]  # (config, num_target_layers=) -> config.json fields
    config_kwargs: Callable[[dict[str, Any]], dict[str, Any]]  # config.json -> config fields

    @property
    def config_cls(self) -> type:
        return getattr(importlib.import_module(self.module), self.config_name)

    @property
    def drafter_cls(self) -> type:
        return getattr(importlib.import_module(self.module), self.drafter_name)

    def config_from_fields(self, raw: dict[str, Any]) -> Any:
        """The config a folder's ``config.json`` describes."""
        return self.config_cls(**self.config_kwargs(raw))


def _block_fields(
    config, *, num_target_layers: int, markov_rank: int, head: str, conf: bool, conf_markov: bool, sts
) -> dict[str, Any]:
    return {
        "block_size": config.block_size,
        "num_target_layers": num_target_layers,
        "target_layer_ids": list(config.target_layer_ids),
        "mask_token_id": config.mask_token_id,
        **({"mask_embedding": True} if config.mask_embedding else {}),
        "draft_qk_norm": config.qk_norm,  # None: the target family's
        "markov_rank": markov_rank,
        "markov_head_type": head,
        "enable_confidence_head": conf,
        "confidence_head_with_markov": conf_markov,
        "num_hidden_layers": config.num_layers,
        "sts_temperatures": list(sts) if sts else None,
        **_vocab_field(config),
        **_anchor_field(config),
    }


def _vocab_field(config) -> dict[str, Any]:
    """``draft_vocab_size`` (vLLM's name), for a reduced draft vocabulary only (older folders unchanged)."""
    n = getattr(config, "draft_vocab_size", None)
    return {"draft_vocab_size": n} if n is not None else {}


def _anchor_field(config) -> dict[str, Any]:
    """``prompt_end_anchors`` (dspark's), only for a drafter trained so (older folders unchanged)."""
    return {"prompt_end_anchors": True} if config.prompt_end_anchors else {}


def _draft_vocab(raw: dict[str, Any]) -> int | None:
    """A folder's reduced draft vocabulary size; None for the full one (exports write N = V)."""
    n = raw.get("draft_vocab_size")
    return None if n is None or n == raw.get("vocab_size") else n


def _dspark_fields(config: DSparkConfig, *, num_target_layers: int) -> dict[str, Any]:
    return _block_fields(
        config,
        num_target_layers=num_target_layers,
        markov_rank=config.markov_rank,
        head=config.markov_head_type,
        conf=config.enable_confidence_head,
        conf_markov=config.confidence_head_with_markov,
        sts=config.sts_temperatures,
    )


def _dflash_fields(config: DFlashConfig, *, num_target_layers: int) -> dict[str, Any]:
    return _block_fields(
        config,
        num_target_layers=num_target_layers,
        markov_rank=0,
        head="vanilla",
        conf=False,
        conf_markov=False,
        sts=None,
    )


def _eagle3_fields(config: Eagle3Config, *, num_target_layers: int) -> dict[str, Any]:
    return {
        "block_size": config.block_size,
        "num_target_layers": num_target_layers,
        "target_layer_ids": list(config.target_layer_ids),
        "num_hidden_layers": 1,
        **_vocab_field(config),
        **_anchor_field(config),
    }


def _dspark_config(raw: dict[str, Any]) -> dict[str, Any]:
    sts = raw.get("sts_temperatures")
    return dict(
        num_layers=raw["num_hidden_layers"],
        block_size=raw["block_size"],
        target_layer_ids=tuple(raw["target_layer_ids"]),
        mask_token_id=raw["mask_token_id"],
        mask_embedding=bool(raw.get("mask_embedding", False)),
        qk_norm=raw.get("draft_qk_norm", True),  # folders before the field: Qwen3 layers
        markov_rank=raw.get("markov_rank", 0),
        markov_head_type=raw.get("markov_head_type", "vanilla"),
        enable_confidence_head=raw.get("enable_confidence_head", False),
        confidence_head_with_markov=raw.get("confidence_head_with_markov", False),
        sts_temperatures=tuple(sts) if sts else None,
        draft_vocab_size=_draft_vocab(raw),
        prompt_end_anchors=bool(raw.get("prompt_end_anchors", False)),
    )


def _dflash_config(raw: dict[str, Any]) -> dict[str, Any]:
    return dict(
        num_layers=raw["num_hidden_layers"],
        block_size=raw["block_size"],
        target_layer_ids=tuple(raw["target_layer_ids"]),
        mask_token_id=raw["mask_token_id"],
        mask_embedding=bool(raw.get("mask_embedding", False)),
        qk_norm=raw.get("draft_qk_norm", True),  # folders before the field: Qwen3 layers
        draft_vocab_size=_draft_vocab(raw),
        prompt_end_anchors=bool(raw.get("prompt_end_anchors", False)),
    )


def _eagle3_config(raw: dict[str, Any]) -> dict[str, Any]:
    return dict(
        block_size=raw["block_size"],
        target_layer_ids=tuple(raw["target_layer_ids"]),
        draft_vocab_size=_draft_vocab(raw),
        prompt_end_anchors=bool(raw.get("prompt_end_anchors", False)),
    )


KINDS: dict[str, DrafterKind] = {
    kind.name: kind
    for kind in (
        # DFlash = the DSpark checkpoint class with markov_rank = 0 and no confidence head (DESIGN §5.4).
        DrafterKind(
            name="dflash",
            module="dspark.drafters.dflash",
            config_name="DFlashConfig",
            drafter_name="DFlashDrafter",
            architecture="Qwen3DSparkModel",
            uses_mask_token=True,
            config_fields=_dflash_fields,
            config_kwargs=_dflash_config,
        ),
        DrafterKind(
            name="dspark",
            module="dspark.drafters.dspark",
            config_name="DSparkConfig",
            drafter_name="DSparkDrafter",
            architecture="Qwen3DSparkModel",
            uses_mask_token=True,
            config_fields=_dspark_fields,
            config_kwargs=_dspark_config,
        ),
        DrafterKind(
            name="eagle3",
            module="dspark.drafters.eagle3",
            config_name="Eagle3Config",
            drafter_name="Eagle3Drafter",
            architecture="LlamaForCausalLMEagle3",
            uses_mask_token=False,
            config_fields=_eagle3_fields,
            config_kwargs=_eagle3_config,
        ),
    )
}


def kind_of_config(config) -> DrafterKind:
    for kind in KINDS.values():
        if type(config) is kind.config_cls:
            return kind
    raise TypeError(f"no drafter kind has config type {type(config).__name__}")


def kind_of_folder_config(raw: dict[str, Any], where: Path) -> DrafterKind:
    """Our ``dspark_method`` field, else DeepSpec/vLLM's ``architectures``."""
    method = raw.get("dspark_method")
    if method is None:
        arch = (raw.get("architectures") or [None])[0]
        if arch in DSPARK_ARCHITECTURES:
            plain = raw.get("markov_rank", 0) == 0 and not raw.get("enable_confidence_head", False)
            method = "dflash" if plain else "dspark"
        elif arch in EAGLE3_ARCHITECTURES:
            method = "eagle3"
    if method not in KINDS:
        raise DsparkError(
            f"{where}: not a drafter folder this version knows "
            f"(dspark_method={raw.get('dspark_method')!r}, architectures={raw.get('architectures')!r})"
        )
    missing = [
        f
        for f in ("block_size", "target_layer_ids", "num_hidden_layers", "vocab_size", "hidden_size")
        if f not in raw
    ] + (["mask_token_id"] if KINDS[method].uses_mask_token and "mask_token_id" not in raw else [])
    if missing:
        raise DsparkError(f"{where}: config.json lacks required fields {missing}")
    return KINDS[method]
