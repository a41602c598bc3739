"""The speculation controller on hand-made timing tables: its math, and its decisions."""

from __future__ import annotations

import math

import pytest

from dspark.scheduler import SpsTable
from dspark.scheduler.acceptance import (
    AcceptanceCounts,
    best_length,
    expected_accepted,
    probe_cost,
    shadow_outcome,
)
from dspark.scheduler.controller import Controller, ControllerConfig, Offer, RoundCosts
from dspark.scheduler.costs import DecayedFit, DraftCosts, StepCosts

K = 7
# A step of R requests costs 1 + 0.5 R; each verified draft adds 0.1 (time units): rho = R / (1 + 0.5 R)
VERIFY = tuple(0.1 * ell for ell in range(K + 1))


def costs(model_s: float, *, call_s: float = 0.0, R: int = 1, drains: bool = False) -> RoundCosts:
    return RoundCosts(
        rho=R / (1 + 0.5 * R),
        verify_s=VERIFY,
        draft_s={"model": model_s, "ngram": 0.0},
        call_s={"model": call_s},
        fixed_share=1 / (1 + 0.5 * R) if drains else 0.0,  # a / (a + c·R)
    )


def test_counts_test_later_drafts_only_after_accepted_ones():
    c = AcceptanceCounts()
    c.observe(7, 3, memory=1.0)  # drafts 1-3 accepted, 4 rejected: 3 later drafts tested, 2 accepted
    c.observe(7, 0, memory=1.0)  # first rejected: nothing later tested
    assert (c.first_tested, c.first_accepted, c.later_tested, c.later_accepted) == (2, 1, 3, 2)
    assert c.rates((0.5, 0.5), strength=0.0) == (0.5, pytest.approx(2 / 3))
    assert AcceptanceCounts().rates((0.3, 0.6), strength=0.0) == (
        0.3,
        0.6,
    )  # no evidence, no weight: the prior


def test_best_length_trades_expected_tokens_against_verification():
    assert expected_accepted(0.8, 0.5, 3) == pytest.approx(0.8 * (1 + 0.5 + 0.25))
    gain, ell = best_length(0.9, 0.9, K, verify_s=VERIFY, rho=2.0)
    assert ell == K and gain > 0  # a good drafter verifies the whole block
    gain, ell = best_length(0.9, 0.1, K, verify_s=VERIFY, rho=2.0)
    assert ell == 1  # later drafts are not worth their 0.2 tokens each
    assert best_length(0.1, 0.1, K, verify_s=VERIFY, rho=2.0, draft_s=1.0)[0] < 0
    assert best_length(0.9, 0.9, 0, verify_s=VERIFY, rho=2.0) == (-math.inf, 0)


def test_a_probe_that_cannot_change_the_verdict_is_never_due():
    # verifying a perfect block would still not repay 10 time units of drafting
    assert probe_cost(1.0, 1.0, 2, verify_s=VERIFY, rho=1.0, draft_s=10.0) == math.inf
    assert 0 < probe_cost(0.2, 0.5, 2, verify_s=VERIFY, rho=1.0, draft_s=0.5) < math.inf


def test_shadow_outcome_waits_until_the_emitted_tokens_decide():
    assert shadow_outcome([5, 6, 7], [5]) is None
    assert shadow_outcome([5, 6, 7], [5, 9]) == (3, 1)
    assert shadow_outcome([5, 6, 7], [5, 6, 7, 8]) == (3, 3)


def test_the_fit_recovers_a_plane_and_keeps_coefficients_non_negative():
    fit = DecayedFit(dims=2, memory=1.0)
    for R, e in [(1, 0), (2, 3), (4, 1), (8, 10), (3, 7)]:
        fit.observe((R, e), 1.0 + 0.5 * R + 0.1 * e)
    assert fit.fit() == pytest.approx((1.0, 0.5, 0.1))
    falling = DecayedFit(dims=1, memory=1.0)
    for n in range(1, 6):
        falling.observe((n,), 5.0 - n)  # a negative slope is clamped: the mean
    assert falling.fit() == pytest.approx((2.0, 0.0))


def test_step_costs_price_from_the_profile_then_from_observed_steps():
    profile = SpsTable.from_dict({b: 1.0 / (1.0 + 0.2 * b) for b in range(1, 200)})
    steps = StepCosts(profile)
    verify_s, rho = steps.prices(4, K)
    assert rho == pytest.approx(4 / 1.8) and verify_s[2] == pytest.approx((1 + 0.2 * 12 - 1.8) / 4)
    for R, e in [(4, 0), (4, 8), (4, 20), (2, 0), (2, 6), (6, 12)] * 5:
        steps.observe(R, R + e, 2.0 + 0.3 * R + 0.05 * e)  # a machine unlike the profile
    verify_s, rho = steps.prices(4, K)
    assert rho == pytest.approx(4 / (2.0 + 1.2), rel=0.02) and verify_s[1] == pytest.approx(0.05, rel=0.2)


def test_draft_costs_split_a_call_once_calls_of_several_sizes_were_seen():
    calls = DraftCosts()
    for _ in range(5):
        calls.observe(4, 2.0)
    assert calls.split((1.0, 0.25)) == pytest.approx((1.0, 0.25))  # one size: in the shape's ratio
    for n in (1, 2, 8):
        calls.observe(n, 1.0 + 0.25 * n)
    assert calls.split() == pytest.approx((1.0, 0.25), rel=0.02)


def test_drafts_when_it_pays_falls_back_probes_and_resumes():
    ctrl = Controller({"model": False}, ControllerConfig(probe_every=2, probe_max=8, probe_budget=1.0))
    offer = Offer(0, {"model": K})
    assert ctrl.plan([offer], costs(0.1))[0].proposer == "model"  # the optimistic prior drafts
    for _ in range(6):  # always rejected: it stops drafting
        ctrl.observe(0, "model", K, 0)
    specs = [ctrl.plan([offer], costs(0.1))[0] for _ in range(30)]
    probes = [i for i, s in enumerate(specs) if s.proposer is not None]
    assert all(specs[i].probe and specs[i].cap == 2 for i in probes)
    assert probes[:3] == [1, 5, 13]  # probe clock 2, 4, 8: the interval doubles while nothing changes
    for _ in range(8):  # the text turned predictable: probes and rounds accept everything
        ctrl.observe(0, "model", K, K)
    spec = ctrl.plan([offer], costs(0.1))[0]
    assert spec.proposer == "model" and not spec.probe and spec.cap == K


def test_a_shared_call_the_batch_does_not_repay_is_only_probed_and_then_joined():
    ctrl = Controller({"model": False})
    for key in range(4):  # every request accepts about half its first drafts
        for accepted in (1, 0, 1, 0, 1):
            ctrl.observe(key, "model", 2, accepted)
    offers = [Offer(key, {"model": K}) for key in range(4)]
    cheap = ctrl.plan(offers, costs(0.05, R=4))
    assert all(s.proposer == "model" for s in cheap)
    blocked = ctrl.plan(offers, costs(0.05, call_s=3.0, R=4))  # a call their gains do not repay
    assert all(s.proposer is None for s in blocked)
    for key in range(4):  # ... until one is due a probe: the call runs, and those it pays join
        ctrl.requests[key].skipped = 0
    ctrl.requests[0].skipped = 10**6
    probed = ctrl.plan(offers, costs(0.05, call_s=3.0, R=4))
    assert probed[0].probe and all(s.proposer == "model" and not s.probe for s in probed[1:])


def test_a_deterministic_proposer_is_never_probed():
    free = Controller({"model": False, "ngram": True})  # the lookup drafts where it pays
    lookups = [Offer(key, {"model": 0, "ngram": 3}) for key in range(3)]
    assert [s.proposer for s in free.plan(lookups, costs(0.05, R=3))] == ["ngram"] * 3
    lookup_only = Controller({"ngram": True}, ControllerConfig(probe_every=1, probe_budget=10.0))
    for _ in range(20):
        assert lookup_only.plan([Offer(0, {"ngram": 0})], costs(0.0))[0].proposer is None


def test_a_draining_batch_values_a_lone_requests_drafts_at_its_own_row_only():
    """With nobody waiting for a slot the batch lasts as long as its last request: drafts one
    request accepts save its row of each step, the fixed part only if every request gains too."""
    ctrl = Controller({"model": False})
    for key in range(4):  # requests 0 and 1 accept 40 % of their first drafts, 2 and 3 none
        for accepted in (1, 0, 1, 0, 0) if key < 2 else (0,) * 5:
            ctrl.observe(key, "model", 1, accepted)
    e, q = ctrl.rates(0, "model")
    rho, w = 4 / 3, 1 - (1 / 3) * (1 - 2 / 4)  # R = 4; half the batch would draft: w = 5/6

    def gain(value: float) -> float:  # max over ℓ of value·E(ℓ) − ρ·v(ℓ)
        return best_length(value * e, q, K, verify_s=VERIFY, rho=rho)[0]

    model_s = (gain(1.0) + gain(w)) / 2 / rho  # drafting pays at 1/ρ, not at w/ρ
    offers = [Offer(key, {"model": K}) for key in range(4)]
    full = ctrl.plan(offers, costs(model_s, R=4))  # slots are the bottleneck: a draft is worth 1/ρ
    assert [s.proposer for s in full] == ["model", "model", None, None]
    drained = ctrl.plan(offers, costs(model_s, R=4, drains=True))
    assert all(s.proposer is None or s.probe for s in drained)
    for key in (2, 3):  # now every request gains: the fixed part is saved too, w = 1
        for _ in range(5):
            ctrl.observe(key, "model", 1, 1)
    assert all(s.proposer == "model" for s in ctrl.plan(offers, costs(model_s, R=4, drains=True)))
