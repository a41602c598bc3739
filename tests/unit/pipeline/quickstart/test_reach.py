"""The steps-needed estimate read off a shipped learning curve (hand-made curves)."""

from __future__ import annotations

import pytest

from dspark.pipeline.quickstart.reach import (
    ALREADY,
    AT_LEAST,
    BEFORE_START,
    BEYOND_END,
    ESTIMATE,
    first_reach,
    scaled,
    steps_to_reach,
)

STEPS = [100, 200, 400, 800]
TAU = [1.5, 2.0, 2.5, 3.0]


def test_first_reach_interpolates_between_logged_points():
    assert first_reach(STEPS, TAU, 2.25) == pytest.approx(300.0)
    assert first_reach(STEPS, TAU, 2.0) == pytest.approx(200.0)  # exactly on a point
    assert first_reach(STEPS, TAU, 1.2) == 100.0  # the first point already reaches it
    assert first_reach(STEPS, TAU, 3.1) is None


def test_first_reach_takes_the_first_crossing_of_a_noisy_curve():
    # up to 2.6, back to 2.2, up again: 2.4 is first reached between steps 200 and 400
    assert first_reach([100, 200, 400, 800], [2.0, 2.2, 2.6, 2.2], 2.4) == pytest.approx(300.0)


def test_steps_between_two_values_on_the_curve():
    r = steps_to_reach(STEPS, TAU, 1.75, 2.75, tokens_per_step=1000.0)
    assert r.kind == ESTIMATE
    assert r.own_step == pytest.approx(150.0) and r.goal_step == pytest.approx(600.0)
    assert r.more_steps == pytest.approx(450.0) and r.more_tokens == pytest.approx(450_000.0)


def test_already_there():
    for own in (3.0, 3.4):
        r = steps_to_reach(STEPS, TAU, own, 3.0, tokens_per_step=1000.0)
        assert r.kind == ALREADY and r.more_steps == 0.0 and r.more_tokens == 0.0


def test_a_goal_beyond_the_curves_end_has_no_estimate():
    r = steps_to_reach(STEPS, TAU, 2.0, 3.2, tokens_per_step=1000.0)
    assert r.kind == BEYOND_END and r.more_steps is None and r.more_tokens is None


def test_a_value_below_the_curves_first_point_gives_a_lower_bound():
    r = steps_to_reach(STEPS, TAU, 1.2, 2.5, tokens_per_step=10.0)
    assert r.kind == AT_LEAST
    assert (
        r.own_step == 100.0
        and r.more_steps == pytest.approx(300.0)
        and r.more_tokens == pytest.approx(3000.0)
    )


def test_both_values_before_the_curves_start_have_no_estimate():
    r = steps_to_reach(STEPS, TAU, 1.1, 1.4, tokens_per_step=10.0)
    assert r.kind == BEFORE_START and r.more_steps is None


def test_scaling_maps_the_last_point_onto_the_value_measured_here():
    out = scaled(TAU, 5.0)  # τ − 1 doubled: 2.0 → 4.0
    assert out == pytest.approx([2.0, 3.0, 4.0, 5.0])
    assert scaled([1.0, 1.0], 2.0) == [1.0, 1.0]  # nothing to scale on a flat τ = 1 curve
    # scaled, the goal (the shipped drafter here) is reached exactly at the curve's end
    r = steps_to_reach(STEPS, out, 3.0, 5.0, tokens_per_step=1.0)
    assert r.goal_step == pytest.approx(800.0) and r.own_step == pytest.approx(200.0)
