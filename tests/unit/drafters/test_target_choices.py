"""The user's layer choice for a new drafter leaves the loaded target alone; the caller asks
for a target with those layers (``TargetAdapter.with_layers``), which shares the model."""

from __future__ import annotations

import pytest

from dspark.drafters.dflash import DFlashConfig
from dspark.drafters.target_choices import apply_target_choices
from dspark.errors import DsparkError


def test_layer_choice_does_not_touch_the_target(target):
    before = target.target_layer_ids
    config = apply_target_choices(DFlashConfig(), target, target_layers="0,1")
    assert config.target_layer_ids == (0, 1)
    assert target.target_layer_ids == before  # not switched behind the caller's back
    chosen = target.with_layers(config.target_layer_ids)
    assert chosen.target_layer_ids == (0, 1) and chosen.model is target.model
    assert target.target_layer_ids == before


def test_out_of_range_layers_are_one_line_errors(target):
    with pytest.raises(DsparkError):
        apply_target_choices(DFlashConfig(target_layer_ids=(0, 99)), target)
    with pytest.raises(ValueError):
        target.with_layers((0, 99))
