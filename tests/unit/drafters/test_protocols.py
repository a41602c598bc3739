"""Every registered drafter meets the protocols: ``Drafter`` (with ``block_size``) for all,
``TrainableDrafter`` for the rows of ``KINDS`` only. Lists come from the registry."""

from __future__ import annotations

import pytest

from dspark.drafters.kinds import KINDS
from dspark.drafters.registry import TRAINABLE, available
from dspark.formats.build import build_drafter
from dspark.protocols import Drafter, TrainableDrafter
from tests.unit.drafters.builders import CONFIGS, build


def test_the_test_builders_cover_every_registered_method():
    from dspark.drafters.kinds import kind_of_config

    assert {kind_of_config(config).name for _, config in CONFIGS.values()} == set(KINDS) == set(TRAINABLE)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_trainable_drafters_meet_both_protocols(name, target):
    drafter = build(name, target)
    assert isinstance(drafter, Drafter) and isinstance(drafter, TrainableDrafter)
    assert drafter.block_size == drafter.config.block_size >= 1


@pytest.mark.parametrize("name", [n for n in available() if n not in ("none", *TRAINABLE)])
def test_training_free_drafters_are_drafters_only(name, target):
    drafter = build_drafter(name, target)
    assert isinstance(drafter, Drafter) and not isinstance(drafter, TrainableDrafter)
    assert drafter.block_size >= 1
