"""What identifies a training run, and the small facts about its target (DESIGN §6).

A checkpoint stores the run's identity — the training config (run-control fields
excluded), the drafter's class and config, the data fingerprint, the target's shape —
and resuming refuses another one (:func:`dspark.training.checkpoint.check_resumable`),
except for fields a newer dspark added, left at their defaults.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from torch import nn

from dspark.data.samples import TrainDataset


def as_json(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    return json.loads(json.dumps(obj, default=str))


def default_model_config(drafter: nn.Module) -> dict[str, Any]:
    """``config.json`` of a checkpoint: the drafter's config fields plus its architecture name."""
    return {"architectures": [type(drafter).__name__], **as_json(drafter.config)}


def run_identity(cfg, target, drafter: nn.Module, dataset: TrainDataset) -> dict[str, Any]:
    return {
        "train": cfg.identity(),
        "drafter": {"class": type(drafter).__name__, **as_json(drafter.config)},
        "data": {"samples": len(dataset), "sha256": dataset.fingerprint},
        "target": {
            "model_type": getattr(target.config, "model_type", None),
            "vocab_size": target.vocab_size,
            "hidden_size": target.hidden_size,
            "num_layers": target.num_layers,
            "target_layer_ids": list(target.target_layer_ids),
        },
    }


def field_defaults(config_cls) -> dict[str, Any]:
    """Each field's default (``default_factory`` called), for fields that have one."""
    out = {}
    for f in dataclasses.fields(config_cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def identity_defaults(cfg, drafter: nn.Module) -> dict[str, Any]:
    """Defaults of the identity's config fields: fields added after a run started may take them."""
    return {"train": field_defaults(type(cfg)), "drafter": field_defaults(type(drafter.config))}


def pad_id(target) -> int:
    tok = getattr(target, "tokenizer", None)
    for attr in ("pad_token_id", "eos_token_id"):
        if tok is not None and getattr(tok, attr, None) is not None:
            return int(getattr(tok, attr))
    return 0
