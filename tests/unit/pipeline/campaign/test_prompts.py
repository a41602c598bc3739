"""Offline training prompts for targets without a corpus (issue 16): deterministic, distinct, balanced."""

from __future__ import annotations

import collections

from dspark.pipeline.campaign.pipeline import training_prompts
from dspark.pipeline.campaign.prompts import synthetic_prompts
from dspark.pipeline.presets import campaign_plans


def test_synthetic_prompts_are_deterministic_distinct_and_balanced():
    a, b = synthetic_prompts(3000, seed=0), synthetic_prompts(3000, seed=0)
    assert [p.turns for p in a] == [p.turns for p in b]
    assert len({p.turns[0] for p in a}) == 3000
    assert collections.Counter(p.domain for p in a) == {"math": 1000, "code": 1000, "chat": 1000}
    assert [p.turns for p in synthetic_prompts(50, seed=1)] != [p.turns for p in a[:50]]
    math = next(p for p in a if p.domain == "math")
    assert "\\boxed{}" in math.turns[0]


def test_each_plan_has_its_prompt_source():
    assert training_prompts(campaign_plans()["tiny"])[0].source.startswith("tiny-corpus:")
    smol = training_prompts(campaign_plans()["smollm2"])
    assert len(smol) == campaign_plans()["smollm2"].prompts and smol[0].source.startswith("synthetic:")
