"""The target model behind one adapter: features, rollback-able KV cache, family quirks (DESIGN §4)."""

from dspark.targets.adapter import (
    TargetAdapter,
    TargetLoadError,
    TargetOutput,
    default_layer_ids,
    parse_layer_ids,
    validate_layer_ids,
)
from dspark.targets.cache import TargetCache
from dspark.targets.families import FamilyQuirks, quirks_for

__all__ = [
    "FamilyQuirks",
    "TargetAdapter",
    "TargetCache",
    "TargetLoadError",
    "TargetOutput",
    "default_layer_ids",
    "parse_layer_ids",
    "quirks_for",
    "validate_layer_ids",
]
