"""The campaign's stop rule: expected τ flat over the last 20 % of the steps (issue 16)."""

from __future__ import annotations

import json

from dspark.pipeline.campaign.pipeline import TAU, PlateauStop
from dspark.pipeline.campaign.plateau import plateaued

STEPS = list(range(10, 1010, 10))  # 100 logged steps


def test_rising_curve_does_not_stop():
    values = [1.0 + s / 1000 for s in STEPS]  # +25 % over the last 20 %
    assert not plateaued(STEPS, values)


def test_flat_curve_stops_and_noise_is_averaged():
    values = [2.0 + (0.05 if i % 2 else -0.05) for i in range(len(STEPS))]  # ±2.5 % noise, no trend
    assert plateaued(STEPS, values)
    assert not plateaued(STEPS, values, min_step=2000), "never before min_step"


def test_slow_rise_below_the_threshold_stops():
    values = [2.0 * (1 + 0.004 * s / 1000) for s in STEPS]  # +0.08 % over the tail
    assert plateaued(STEPS, values, min_gain=0.01)
    assert not plateaued(STEPS, values, min_gain=0.0001)


def test_too_short_a_history_never_stops():
    assert not plateaued([10, 20, 30], [2.0, 2.0, 2.0])
    assert not plateaued([], [])


def test_resumed_stop_rule_replays_history_up_to_the_resume_step(tmp_path):
    """A run killed at step 600 and resumed from its step-500 checkpoint decides like an unbroken run."""
    metrics = tmp_path / "metrics.jsonl"
    flat = {s: 2.0 for s in STEPS}
    lines = [json.dumps({"step": s, TAU: flat[s]}) for s in STEPS if s <= 600]
    metrics.write_text("\n".join(lines) + "\n")

    unbroken = PlateauStop(tmp_path / "none.jsonl", tail=0.2, gain=0.01, min_step=0)
    decisions = {s: unbroken(s, {TAU: flat[s]}) for s in STEPS}

    resumed = PlateauStop(metrics, tail=0.2, gain=0.01, min_step=0)  # records after 500 are replayed live
    replayed = {s: resumed(s, {TAU: flat[s]}) for s in STEPS if s > 500}
    assert replayed == {s: decisions[s] for s in STEPS if s > 500}
    assert resumed.steps == STEPS  # no step counted twice
