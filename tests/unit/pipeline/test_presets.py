"""The pipeline's presets: one table, read by both commands, with the numbers they have always run."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from dspark.commands.args.campaign import add_campaign_args
from dspark.pipeline.presets import PRESETS, CampaignPlan, QuickstartPlan, campaign_plans, quickstart_plan


def test_every_preset_is_a_frozen_plan():
    assert set(PRESETS) == {"tiny_fast", "tiny", "tiny_converged", "smollm2_converged"}
    for plan in PRESETS.values():
        assert isinstance(plan, (QuickstartPlan, CampaignPlan))
        with pytest.raises(dataclasses.FrozenInstanceError):
            plan.seed = 1  # type: ignore[misc]


def test_the_quickstart_reads_its_plan_from_the_table():
    assert quickstart_plan(fast=True) is PRESETS["tiny_fast"]
    assert quickstart_plan(fast=False) is PRESETS["tiny"]
    # the budgets the command has always run (a change here changes every stage key)
    assert (PRESETS["tiny_fast"].train_steps, PRESETS["tiny_fast"].train_prompts) == (6, 24)
    assert (PRESETS["tiny"].train_steps, PRESETS["tiny"].train_prompts) == (150, 240)


def test_the_campaign_chooses_its_target_from_the_table():
    plans = campaign_plans()
    assert plans == {"tiny": PRESETS["tiny_converged"], "smollm2": PRESETS["smollm2_converged"]}
    parser = argparse.ArgumentParser()
    add_campaign_args(parser)
    assert parser.parse_args([]).target == "tiny"
    assert parser.parse_args(["--target", "smollm2"]).target == "smollm2"
    smollm2 = plans["smollm2"]
    assert (plans["tiny"].epochs, smollm2.prompts, smollm2.draft_vocab) == (10.0, 3000, 8192)
