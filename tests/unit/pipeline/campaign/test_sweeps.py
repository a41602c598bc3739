"""The campaign's sweep variants (paper Figs. 3 and 4): names, config changes, reuse of its drafters."""

from __future__ import annotations

import dataclasses

import pytest

from dspark.pipeline.campaign.sweeps import (
    parse_sweeps,
    reused_method,
    sweep_plan,
    sweep_variants,
    training_order,
)
from dspark.pipeline.presets import campaign_plans
from dspark.presets import drafters as presets

PLAN = campaign_plans()["tiny"]
BASES = {"dspark": presets.dspark_tiny(), "dflash": presets.dflash_tiny()}


def test_depth_variants_change_only_the_depth_and_the_preset_depth_is_the_campaign_drafter():
    variants = {v.name: v for v in sweep_variants("depth", PLAN, BASES)}
    assert list(variants) == ["dspark-1L", "dspark-2L", "dspark-5L", "dflash-5L"]
    assert variants["dspark-1L"].changes == (("num_layers", 1),)
    assert variants["dspark-2L"].changes == ()  # the preset is 2 layers: the campaign's DSpark
    assert variants["dflash-5L"].changes == (("num_layers", 5),)
    assert variants["dflash-5L"].config(BASES["dflash"]).num_layers == 5
    assert variants["dflash-5L"].config(BASES["dflash"]).block_size == BASES["dflash"].block_size
    assert [reused_method(v, PLAN) for v in variants.values()] == [None, "dspark", None, None]


def test_block_size_variants_are_draft_lengths_gamma_plus_one():
    variants = sweep_variants("block-size", PLAN, BASES)
    assert [v.label for v in variants] == [
        f"{m} L={n}" for m in ("dspark", "dflash") for n in PLAN.block_lengths
    ]
    by_name = {v.name: v for v in variants}
    assert by_name["dspark-L4"].config(BASES["dspark"]).block_size == 3
    assert by_name["dflash-L16"].config(BASES["dflash"]).block_size == 15
    assert by_name["dspark-L8"].changes == by_name["dflash-L8"].changes == ()  # the presets' γ = 7
    with pytest.raises(ValueError, match=">= 2"):
        sweep_variants("block-size", dataclasses.replace(PLAN, block_lengths=(1,)), BASES)


def test_a_sweep_with_its_own_budget_trains_every_variant():
    plan = dataclasses.replace(PLAN, sweep_epochs=3.0)
    assert sweep_plan(plan).epochs == 3.0 and sweep_plan(PLAN).epochs == PLAN.epochs
    assert all(reused_method(v, plan) is None for v in sweep_variants("depth", plan, BASES))
    same = dataclasses.replace(PLAN, sweep_epochs=PLAN.epochs)
    assert [v.name for v in sweep_variants("depth", same, BASES) if reused_method(v, same)] == ["dspark-2L"]


def test_parse_sweeps_names_the_bad_kind():
    assert parse_sweeps("depth, block-size") == ("depth", "block-size")
    assert parse_sweeps("") == ()
    with pytest.raises(ValueError, match="unknown --sweeps width"):
        parse_sweeps("depth,width")
    with pytest.raises(ValueError, match="unknown sweep"):
        sweep_variants("width", PLAN, BASES)


def test_the_depth_sweep_trains_its_deepest_variants_first():
    depth = sweep_variants("depth", PLAN, BASES)
    assert [v.name for v in training_order("depth", depth)] == [
        "dspark-5L",
        "dflash-5L",
        "dspark-2L",
        "dspark-1L",
    ]
    block = sweep_variants("block-size", PLAN, BASES)
    assert training_order("block-size", block) == block
