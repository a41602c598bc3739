"""Observed step times over the profiled SPS curve: what payoff control prices with (issue 17)."""

from __future__ import annotations

import pytest

from dspark.scheduler import SpsTable
from dspark.scheduler.step_times import StepTimes

# A profile taken during a burst of other work: verifying anything costs +25 % or more.
PROFILE = SpsTable.from_dict({1: 100.0, 2: 80.0, 4: 70.0, 8: 60.0})


def test_before_any_observation_the_profile_is_used_as_is():
    times = StepTimes(PROFILE)
    assert times.seconds(1) == pytest.approx(0.010)
    assert times.tokens_per_s(1) == pytest.approx(100.0)
    t3 = (1 / 80 + 1 / 70) / 2  # the table interpolates step time linearly between sizes
    assert times.verify_costs(1, 3) == pytest.approx((0.0, 0.0125 - 0.010, t3 - 0.010, 1 / 70 - 0.010))


def test_observed_sizes_replace_the_profile_and_set_the_scale_of_the_others():
    times = StepTimes(PROFILE, min_count=3, memory=1.0)  # plain means
    for _ in range(5):
        times.observe(1, 0.020)  # the machine is twice as slow now ...
        times.observe(2, 0.021)  # ... and one extra token costs +5 %, not +25 %
    assert times.seconds(1) == pytest.approx(0.020)
    assert times.seconds(2) == pytest.approx(0.021)
    assert times.scale == pytest.approx((0.020 / 0.010 + 0.021 / 0.0125) / 2)
    assert times.seconds(8) == pytest.approx(times.scale / 60.0)  # unobserved: the profile, rescaled
    assert times.tokens_per_s(1) == pytest.approx(50.0)
    v = times.verify_costs(1, 7)
    assert v[1] == pytest.approx(0.001)
    assert all(b >= a for a, b in zip(v, v[1:]))  # never cheaper to verify more


def test_a_size_seen_fewer_than_min_count_times_is_still_priced_by_the_profile():
    times = StepTimes(PROFILE, min_count=3)
    times.observe(4, 0.5)
    times.observe(4, 0.5)
    assert times.seconds(4) == pytest.approx(times.scale / 70.0)
    times.observe(4, 0.5)
    assert times.seconds(4) == pytest.approx(0.5)


def test_verification_costs_stay_non_decreasing_when_observed_and_profiled_sizes_mix():
    times = StepTimes(PROFILE, min_count=1)
    times.observe(1, 0.010)
    times.observe(8, 0.011)  # observed 8 rows cheap, unobserved 4 rows priced by the profile
    v = times.verify_costs(1, 7)
    assert all(b >= a for a, b in zip(v, v[1:]))
    assert v[7] >= v[3]


def test_bad_observations_are_ignored():
    times = StepTimes(PROFILE)
    times.observe(0, 1.0)
    times.observe(3, -1.0)
    assert times.counts == {} and times.scale == 1.0
