"""Observed step and drafting costs fitted affine in size, over the profiled SPS curve: what
payoff control prices with (issue 17). Hand-made timing tables only, no clock."""

from __future__ import annotations

import pytest

from dspark.scheduler import SpsTable
from dspark.scheduler.step_times import DecayedLine, DecayedPlane, DraftCosts, StepTimes, fit_line, fit_plane

# A machine whose step of B rows takes 10 ms + 1 ms per row.
AFFINE = SpsTable.from_dict({b: 1.0 / (0.010 + 0.001 * b) for b in range(1, 65)})
# A profile taken under other load, a staircase: one extra token per request priced +44 %
# of a 4-row step, two to six +54 %.
STAIRCASE = SpsTable.from_dict({4: 1 / 0.0100, 5: 1 / 0.0144, 8: 1 / 0.0144, 28: 1 / 0.0154, 32: 1 / 0.0200})


def line_of(points, memory: float = 1.0) -> DecayedLine:
    line = DecayedLine(memory)
    for x, y in points:
        line.observe(x, y)
    return line


def test_fit_line_recovers_an_affine_law():
    a, b = fit_line(line_of([(x, 2.0 + 0.5 * x) for x in range(1, 9)]))
    assert (a, b) == pytest.approx((2.0, 0.5))


def test_fit_line_keeps_intercept_and_slope_non_negative():
    # Falling times (noise): a step never gets cheaper with more rows, so the slope is 0.
    assert fit_line(line_of([(1, 3.0), (2, 2.0), (3, 1.0)])) == pytest.approx((2.0, 0.0))
    # A steep line through negative intercept: the best line through the origin instead.
    a, b = fit_line(line_of([(10, 1.0), (11, 3.0)]))
    assert a == 0.0 and b == pytest.approx((10 * 1.0 + 11 * 3.0) / (10**2 + 11**2))
    assert fit_line(DecayedLine()) == (0.0, 0.0)


def test_recent_points_outweigh_old_ones():
    old = [(x, 1.0 + 0.1 * x) for x in (1, 4, 8)] * 20
    new = [(x, 2.0 + 0.1 * x) for x in (1, 4, 8)] * 5
    a, b = fit_line(line_of(old + new, memory=0.8))
    assert a == pytest.approx(2.0, abs=0.05) and b == pytest.approx(0.1, abs=0.01)


def test_prior_points_pin_the_slope_of_points_without_spread():
    a, b = fit_line(line_of([(4, 0.028)] * 20), prior=[(4, 0.028), (32, 0.084)], prior_weight=2.0)
    assert a + 4 * b == pytest.approx(0.028) and b == pytest.approx(0.002)


def test_before_any_observation_the_profile_is_the_price():
    times = StepTimes(AFFINE)
    assert times.verify_costs(1, 3) == pytest.approx((0.0, 0.001, 0.002, 0.003))
    assert times.tokens_per_s(1, 7) == pytest.approx(1 / 0.011)
    assert times.verify_costs(4, 7)[1] == pytest.approx(0.001)  # one more row per request: 1 ms each
    stairs = StepTimes(STAIRCASE).verify_costs(4, 7)
    assert stairs[1] == pytest.approx(0.0011)  # +44 % of the 10 ms step for one token each
    assert stairs == pytest.approx(tuple((1 / STAIRCASE(4 + 4 * ell) - 0.010) / 4 for ell in range(8)))


def test_after_one_observation_the_line_prices_with_the_profile_as_its_shape():
    times = StepTimes(AFFINE)
    times.observe(1, 0.022)  # twice as slow as profiled
    assert times.verify_costs(1, 3) == pytest.approx((0.0, 0.002, 0.004, 0.006), rel=0.05)
    assert times.tokens_per_s(1, 3) == pytest.approx(1 / 0.022, rel=0.05)


def test_observed_steps_with_spread_replace_a_staircase_profile():
    """The c = 4 case: steps of 4..32 rows observed, each size once or twice (no size often
    enough for a mean of its own), on a line of 20 ms + 0.4 ms per row."""
    times = StepTimes(STAIRCASE)
    for B in (4, 8, 12, 15, 20, 22, 26, 32, 4, 21, 30, 9):
        times.observe(B, 0.020 + 0.0004 * B)
    v = times.verify_costs(4, 7)
    assert v[1] == pytest.approx(0.0004, rel=0.1)  # the staircase said 1.1 ms
    assert v[7] == pytest.approx(7 * 0.0004, rel=0.1)
    assert times.tokens_per_s(4, 7) == pytest.approx(4 / 0.0216, rel=0.05)
    verify_s, rho = times.prices(4, 7)
    assert verify_s == pytest.approx(v) and rho == pytest.approx(times.tokens_per_s(4, 7))


def test_a_batch_that_never_drafts_takes_its_slope_from_the_profile_rescaled():
    times = StepTimes(AFFINE)
    for _ in range(30):
        times.observe(4, 0.028)  # the machine is twice as slow as profiled, only 4-row steps
    assert times.scale == pytest.approx(2.0)
    assert times.seconds(4, span=8) == pytest.approx(0.028, rel=0.01)
    assert times.verify_costs(4, 7)[1] == pytest.approx(0.002, rel=0.05)  # the profile's 1 ms, doubled


def test_verification_costs_are_non_decreasing_and_bad_observations_ignored():
    times = StepTimes(STAIRCASE)
    times.observe(0, 1.0)
    times.observe(3, -1.0)
    assert times.line.w == 0 and times.scale == 1.0
    times.observe(8, 0.030)
    times.observe(16, 0.010)  # a noisy, cheaper bigger step
    v = times.verify_costs(4, 7)
    assert all(b >= a >= 0 for a, b in zip(v, v[1:]))


def test_draft_costs_split_per_call_and_per_request():
    costs = DraftCosts(memory=1.0)
    for n in (1, 4, 2, 3, 1, 4):
        costs.observe(n, 0.004 + 0.001 * n)
    assert costs.split() == pytest.approx((0.004, 0.001))


def test_draft_costs_of_one_call_size_follow_the_shape_they_are_given():
    costs = DraftCosts()
    assert not costs.observed and costs.split() == (0.0, 0.0)
    for _ in range(5):
        costs.observe(4, 0.008)
    assert costs.split() == pytest.approx((0.0, 0.002))  # by default all of it per request
    d0, d1 = costs.split((3.0, 1.0))  # e.g. the target's step: 3 parts per call, 1 per request
    assert d0 + 4 * d1 == pytest.approx(0.008) and d0 == pytest.approx(3 * d1)


def test_fit_plane_recovers_an_affine_law_and_keeps_its_coefficients_non_negative():
    plane = DecayedPlane(memory=1.0)
    for x1 in (1, 2, 4, 8):
        for x2 in (0, 3, 7, 20):
            plane.observe((x1, x2), 5.0 + 2.0 * x1 + 0.5 * x2)
    assert fit_plane(plane) == pytest.approx((5.0, 2.0, 0.5))
    falling = DecayedPlane(memory=1.0)  # more rows, cheaper (noise): that slope is 0
    for x1, x2 in ((1, 0), (2, 0), (4, 0), (2, 5), (2, 9)):
        falling.observe((x1, x2), 5.0 + 2.0 * x1 - 0.1 * x2)
    a, c, b = fit_plane(falling)
    assert b == 0.0 and min(a, c) >= 0.0
    assert fit_plane(DecayedPlane()) == (0.0, 0.0, 0.0)
    jump = DecayedPlane(memory=1.0, dims=3)  # a fixed part wherever x2 > 0
    for x1, x2 in ((1, 0), (2, 0), (4, 0), (2, 5), (2, 9), (4, 3), (1, 7)):
        jump.observe((x1, x2, float(x2 > 0)), 5.0 + 2.0 * x1 + 0.5 * x2 + 3.0 * (x2 > 0))
    assert fit_plane(jump) == pytest.approx((5.0, 2.0, 0.5, 3.0))


def test_a_verified_row_is_priced_apart_from_a_decoding_requests_row():
    """Steps of 1-4 requests, some verifying: 10 ms + 2 ms per request + 0.5 ms per extra row.
    One line in rows prices both kinds of row alike; the plane prices verification at the
    extra rows' slope and plain decoding at the requests'."""
    times = StepTimes(AFFINE)
    for R, extra in ((4, 0), (4, 12), (3, 0), (4, 20), (2, 0), (4, 6), (1, 0), (3, 14), (4, 28), (2, 8)) * 3:
        times.observe(R + extra, 0.010 + 0.002 * R + 0.0005 * extra, num_requests=R)
    verify_s, rho = times.prices(4, 7)
    assert verify_s[1] == pytest.approx(0.0005, rel=0.05) and verify_s[7] == pytest.approx(0.0035, rel=0.05)
    assert rho == pytest.approx(4 / 0.018, rel=0.02) and times.tokens_per_s(4, 7) == pytest.approx(rho)
    _, b = times.fit(4, 32)  # the line in rows prices a verified row 30 % dearer
    assert b > 1.3 * 0.0005
    assert times.step_model(4, 7) == pytest.approx((0.010, 0.002, 0.0005, 0.0), rel=0.1, abs=1e-4)


def test_without_steps_that_tell_them_apart_the_plane_prices_as_the_line():
    times = StepTimes(AFFINE)
    for B in (4, 8, 12, 16, 20, 24, 28, 32):  # every step one row per request: no extra rows seen
        times.observe(B, 0.020 + 0.0004 * B)
    _, b = times.fit(4, 32)
    verify_s, rho = times.prices(4, 7)
    assert verify_s[1] == pytest.approx(b, rel=0.15) and rho == pytest.approx(4 / 0.0216, rel=0.05)


def test_a_step_in_which_anybody_verifies_pays_its_fixed_part_once():
    """Steps of 4 requests: 18 ms + 0.5 ms per extra row, and 4 ms more in any step that
    verifies. ``j`` is priced apart from the rows (a little low: the line's prior has no
    jump); without the jump it is 0."""
    law = lambda e: 0.018 + 0.0005 * e + 0.004 * (e > 0)  # noqa: E731
    steps = (0, 3, 0, 7, 12, 0, 20, 28, 0, 5, 9) * 3  # extra rows of each step
    times = StepTimes(AFFINE)
    assert times.verifying_step_s(4, 7) == 0.0  # before any step: the profile has no such part
    for extra in steps:
        times.observe(4 + extra, law(extra), num_requests=4)
    model = times.step_model(4, 7)
    assert model.j == pytest.approx(0.004, rel=0.15) and times.verifying_step_s(4, 7) == model.j
    assert model.b == pytest.approx(0.0005, rel=0.1) and times.verify_costs(4, 7)[2] == pytest.approx(
        2 * model.b
    )
    assert model(4, 0) == pytest.approx(law(0), rel=0.02) and model(4, 6) == pytest.approx(law(6), rel=0.02)
    smooth = StepTimes(AFFINE)
    for extra in steps:
        smooth.observe(4 + extra, law(extra) - 0.004 * (extra > 0), num_requests=4)
    assert smooth.verifying_step_s(4, 7) == pytest.approx(0.0, abs=2e-4)
