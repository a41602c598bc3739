"""The user's per-target choices for a new drafter: feature layers and mask input (DESIGN §4, §5.1).

``dspark train --target-layers 1,9,17 --mask-token TOKEN`` (or a preset's fields) end up
here, validated against the loaded target, with one-line errors for the CLI.
"""

from __future__ import annotations

import dataclasses

from dspark.drafters.kinds import kind_of_config
from dspark.drafters.mask import mask_overrides
from dspark.drafters.registry import MASK_TOKEN_METHODS
from dspark.errors import DsparkError
from dspark.targets.adapter import check_new_layer_ids, parse_layer_ids


def apply_target_choices(config, target, *, target_layers: str | None = None, mask_token: str | None = None):
    """``config`` with validated feature layers and mask choice.

    ``target_layers`` (``"1,9,17"``) overrides the preset's ``target_layer_ids``; either
    must be non-empty, ascending and in range for ``target``. ``target`` is not changed: the
    caller computes the drafter's features with ``target.with_layers(config.target_layer_ids)``.
    """
    changes = {}
    if target_layers is not None:
        changes["target_layer_ids"] = parse_layer_ids(target_layers, target.num_layers)
    elif config.target_layer_ids is not None:
        try:
            check_new_layer_ids(config.target_layer_ids, target.num_layers)
        except ValueError as e:
            raise DsparkError(f"the preset's target_layer_ids do not fit this target: {e}") from None
    if mask_token is not None:
        if not kind_of_config(config).uses_mask_token:
            raise DsparkError(
                f"--mask-token applies to parallel drafters ({', '.join(MASK_TOKEN_METHODS)}) only"
            )
        changes |= mask_overrides(mask_token, target.tokenizer, target.vocab_size)
    return dataclasses.replace(config, **changes)
