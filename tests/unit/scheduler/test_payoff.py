"""The payoff controller as a pure function of hand-made histories and timing tables (issue 17)."""

from __future__ import annotations

import pytest

from dspark.scheduler.payoff import (
    AcceptanceRecord,
    PayoffConfig,
    PayoffController,
    Realism,
    RoundCosts,
    best_length,
    expected_accepted,
    explored_length,
    probe_cost,
    probe_value,
    shadow_outcome,
    upper_rates,
    wilson_upper,
)
from dspark.scheduler.shared_costs import drain_value, shared_call_pays, verification_pays

# A batch-1 machine in units of one decode step (10 ms): each verified token adds 5 % of a
# step (v(ℓ) = 0.05 ℓ steps), plain decoding makes 100 tokens/s (ρ), the model drafter costs
# 40 % of a step.
STEP = 0.010


def linear(per_token: float, K: int = 7) -> tuple[float, ...]:
    return tuple(per_token * ell for ell in range(K + 1))


COSTS = RoundCosts(
    verify_s=linear(0.05 * STEP), tokens_per_s=1 / STEP, draft_s={"model": 0.4 * STEP, "ngram": 0.002 * STEP}
)


def controller_with(history: dict[str, list[tuple[int, int]]], **config) -> PayoffController:
    c = PayoffController(config=PayoffConfig(**config))
    for proposer, rounds in history.items():
        for verified, accepted in rounds:
            c.observe(proposer, verified, accepted)
    return c


def test_record_counts_first_and_conditional_acceptance():
    r = AcceptanceRecord()
    r.observe(5, 2, memory=1.0)  # positions 1, 2 accepted, 3 rejected, 4-5 never tested
    r.observe(3, 0, memory=1.0)
    r.observe(0, 0, memory=1.0)  # nothing verified: no evidence
    assert (r.first_tested, r.first_accepted) == (2, 1)
    assert (r.later_tested, r.later_accepted) == (2, 1)  # positions 2 (accepted) and 3 (rejected)
    e, q = r.rates(PayoffConfig(prior_strength=0.0))
    assert (e, q) == (0.5, 0.5)


def test_expected_accepted_is_the_geometric_survival_sum():
    assert expected_accepted(0.8, 0.5, 3) == pytest.approx(0.8 + 0.4 + 0.2)
    assert expected_accepted(0.8, 0.5, 0) == 0.0


def test_best_length_stops_where_one_more_draft_no_longer_gains():
    # increments e q^k - ρm = 0.9·0.5^k - 0.05: positive for k <= 4, so ℓ = 5
    gain, ell = best_length(0.9, 0.5, 7, draft_s=0.0, costs=COSTS)
    assert ell == 5
    assert gain == pytest.approx(expected_accepted(0.9, 0.5, 5) - 5 * 0.05)
    # the drafter's own time is paid once, whatever ℓ
    costly, same_ell = best_length(0.9, 0.5, 7, draft_s=0.4 * STEP, costs=COSTS)
    assert same_ell == 5 and costly == pytest.approx(gain - 0.4)
    assert best_length(0.9, 0.5, 0, draft_s=0.0, costs=COSTS) == (float("-inf"), 0)


def test_falls_back_to_plain_decoding_when_drafting_does_not_pay():
    """A model drafter that is rejected every time costs 40 % of a step per round: decode plainly."""
    c = controller_with({"model": [(7, 0)] * 6}, probe_every=4, probe_max=16)
    choices = [c.decide({"model": 7}, COSTS) for _ in range(40)]
    drafted = [i for i, ch in enumerate(choices) if ch.proposer is not None]
    assert all(choices[i].probe and choices[i].length == 2 for i in drafted)  # short probes only
    assert drafted == [3, 11, 27]  # every 4, then 8, then 16 rounds (interval doubles to probe_max)


def test_a_probe_costs_its_seconds_less_what_it_is_expected_to_accept():
    # ρ = 100 tokens/s: verifying 2 costs 0.1 token, the drafter 0.4, a shared call 0.2 more;
    # e = 0.3, q = 0.5 accept 0.3 + 0.15 = 0.45 of them: 0.7 - 0.45 = 0.25 tokens net
    cost = probe_cost(0.3, 0.5, 2, draft_s=0.4 * STEP, call_s=0.2 * STEP, costs=COSTS)
    assert cost == pytest.approx(0.25)
    assert probe_cost(0.9, 0.9, 2, draft_s=0.0, call_s=0.0, costs=COSTS) == 0.0  # it would pay
    # 7 perfect drafts gain 7 - 0.35 tokens: a drafter costing 7 steps per round never can
    assert probe_cost(1.0, 1.0, 2, draft_s=7 * STEP, call_s=0.0, costs=COSTS) == float("inf")
    # a probe that pays a step's fixed part of verification alone: 8 steps' worth more, and
    # still probed where a batch drafting together could share it
    alone = probe_cost(0.3, 0.5, 2, draft_s=0.4 * STEP, call_s=0.2 * STEP, costs=COSTS, step_s=8 * STEP)
    assert alone == pytest.approx(8.25)


def test_a_costly_probe_waits_until_it_is_a_small_share_of_plain_decoding():
    """A probe costing 0.5 tokens with a 2 % budget is due after 25 skipped rounds at the
    earliest, whatever the probe clock says; an unpayable proposer is never probed."""
    c = controller_with({"model": [(7, 0)] * 6}, probe_every=4, probe_max=64, probe_budget=0.02)
    choices = [c.decide({"model": 7}, COSTS, probe_costs={"model": 0.5}) for _ in range(120)]
    probes = [i for i, ch in enumerate(choices) if ch.probe]
    assert probes == [24, 49, 74, 106]  # waits 25, 25, 25, then the doubled clock's 32
    never = controller_with({"model": [(7, 0)] * 6}, probe_every=4)
    choices = [never.decide({"model": 7}, COSTS, probe_costs={"model": float("inf")}) for _ in range(200)]
    assert all(ch.proposer is None for ch in choices)


def test_a_probes_value_is_what_drafting_after_it_would_gain_over_the_rounds_left():
    # accepted with e = 0.4: then 0.3 tokens a round; missed: nothing pays; 50 rounds left
    assert probe_value(0.4, 0.3, -0.2, 50) == pytest.approx(50 * 0.4 * 0.3)
    assert probe_value(0.4, -0.1, -0.2, 50) == 0.0  # no outcome changes the verdict
    record = AcceptanceRecord()
    record.observe(7, 0, 0.9)
    hit, miss = record.after_probe(True, 0.9), record.after_probe(False, 0.9)
    assert (hit.first_tested, hit.first_accepted) == pytest.approx((1.9, 1.0))
    assert (miss.first_tested, miss.first_accepted) == pytest.approx((1.9, 0.0))
    assert (record.first_tested, record.first_accepted) == (1.0, 0.0)  # the record itself unchanged


def test_a_probe_worth_its_cost_is_due_with_the_probe_clock():
    """The 0.5-token probe that waits 25 rounds on its budget is due after the clock's 4
    when what it may tell is worth at least 0.5 tokens, and not when it is worth less or
    the value is switched off."""

    def probes(value, value_probes=True):
        c = controller_with({"model": [(7, 0)] * 6}, probe_every=4, probe_max=64, value_probes=value_probes)
        values = {} if value is None else {"model": value}
        choices = [
            c.decide({"model": 7}, COSTS, probe_costs={"model": 0.5}, probe_values=values) for _ in range(60)
        ]
        return [i for i, ch in enumerate(choices) if ch.probe]

    assert probes(0.5) == [3, 11, 27, 59]  # the doubling clock alone: 4, 8, 16, 32
    assert probes(0.49) == probes(None) == probes(5.0, value_probes=False) == [24, 49]


def test_resumes_drafting_when_the_text_turns_predictable():
    c = controller_with({"model": [(7, 0)] * 6}, probe_every=4)
    assert c.decide({"model": 7}, COSTS).proposer is None
    for _ in range(4):  # probes (or real rounds) that accept everything
        c.observe("model", 2, 2)
    choice = c.decide({"model": 7}, COSTS)
    assert choice.proposer == "model" and not choice.probe and choice.length >= 3
    assert c.interval == 4  # the probe clock starts afresh


def test_a_shadowed_proposer_is_never_probed():
    c = controller_with({"ngram": [(7, 0)] * 20}, probe_every=2)
    choices = [c.decide({"ngram": 5}, COSTS, shadowed=("ngram",)) for _ in range(10)]
    assert all(ch.proposer is None for ch in choices)


def test_no_history_is_optimistic_so_every_proposer_gets_tried():
    assert PayoffController().decide({"model": 7}, COSTS).proposer == "model"


def test_repetitive_text_picks_ngram():
    """Both accept well on repetitive text; the n-gram costs nothing, so it wins."""
    c = controller_with({"ngram": [(7, 7), (7, 6), (7, 7)], "model": [(7, 7), (7, 5), (7, 6)]})
    choice = c.decide({"ngram": 7, "model": 7}, COSTS, shadowed=("ngram",))
    assert choice.proposer == "ngram" and choice.length == 7


def test_free_text_picks_the_model():
    """The lookup's continuations are rejected, the model's accepted: the model pays despite its cost."""
    c = controller_with({"ngram": [(4, 0), (3, 1), (5, 0), (2, 0)], "model": [(7, 4), (7, 6), (7, 3)]})
    assert c.decide({"ngram": 4, "model": 7}, COSTS, shadowed=("ngram",)).proposer == "model"


def test_no_ngram_match_leaves_the_model():
    c = controller_with({"ngram": [(7, 7)] * 4, "model": [(7, 5)] * 4})
    assert c.decide({"ngram": 0, "model": 7}, COSTS).proposer == "model"


def test_a_cheaper_round_at_a_bigger_batch_changes_the_verdict():
    """The same modest history: unprofitable at batch 1 (ρd large), profitable with a free drafter."""
    c = controller_with({"model": [(7, 0), (7, 1), (7, 0), (7, 0)]})
    assert c.decide({"model": 7}, COSTS).proposer is None
    free = RoundCosts(verify_s=linear(0.01 * STEP), tokens_per_s=1 / STEP, draft_s={"model": 0.0})
    assert c.decide({"model": 7}, free).proposer == "model"


def test_shadow_outcome():
    assert shadow_outcome([4, 5, 6], []) is None  # nothing emitted yet
    assert shadow_outcome([4, 5, 6], [4, 5]) is None  # matching so far
    assert shadow_outcome([4, 5, 6], [4, 9]) == (3, 1)
    assert shadow_outcome([4, 5, 6], [4, 5, 6, 7]) == (3, 3)
    assert shadow_outcome([4, 5, 6], [8]) == (3, 0)


def test_bad_config_is_refused():
    with pytest.raises(ValueError):
        PayoffConfig(probe_every=8, probe_max=4)
    for bad in ({"explore": -1.0}, {"pool_aging": 0.0}, {"pool_aging": 1.5}):
        with pytest.raises(ValueError):
            PayoffConfig(**bad)


def test_the_pooled_rates_upper_bound_is_wilsons_and_narrows_with_evidence():
    """``upper_rates``: the Wilson score bound at z = ``explore`` over the decayed trials; at
    or above the mean, falling towards it as evidence grows; the mean itself at z = 0."""
    config = PayoffConfig()
    pool = AcceptanceRecord(8.0, 4.0, 4.0, 3.0, rounds=1000)  # e = 0.5 on 8, q = 0.75 on 4
    e, q = upper_rates(pool, config)
    # hand-computed: (p + 1/2n + sqrt(p(1-p)/n + 1/4n²)) / (1 + 1/n)
    assert e == pytest.approx((0.5 + 1 / 16 + (0.25 / 8 + 1 / 256) ** 0.5) / (9 / 8))
    assert q == pytest.approx((0.75 + 1 / 8 + (0.1875 / 4 + 1 / 64) ** 0.5) / (5 / 4))
    assert upper_rates(pool, PayoffConfig(explore=0.0)) == pytest.approx(pool.rates(config))
    bounds = [
        upper_rates(AcceptanceRecord(n, 0.3 * n, n, 0.6 * n, rounds=100), config) for n in (2, 10, 100, 1e4)
    ]
    for (e1, q1), (e2, q2) in zip(bounds, bounds[1:]):
        assert e1 > e2 > 0.3 and q1 > q2 > 0.6
    assert bounds[-1] == pytest.approx((0.3, 0.6), abs=0.01)
    assert upper_rates(AcceptanceRecord(rounds=1000), config) == pytest.approx((1.0, 1.0))  # nothing known


def test_aging_keeps_the_rates_and_widens_their_bound():
    pool = AcceptanceRecord(50.0, 20.0, 20.0, 10.0, rounds=1000)
    before_rates, before_bound = pool.rates(PayoffConfig()), upper_rates(pool, PayoffConfig())
    pool.age(0.5)
    assert (pool.first_tested, pool.first_accepted, pool.later_tested, pool.later_accepted) == (25, 10, 10, 5)
    assert pool.rates(PayoffConfig()) == pytest.approx(before_rates)
    after = upper_rates(pool, PayoffConfig())
    assert after[0] > before_bound[0] and after[1] > before_bound[1]


def test_a_drafting_round_verifies_as_far_as_the_bound_on_later_acceptance_pays():
    """``explored_length``: on thin evidence of q the round verifies further than the mean pays
    for (the block is drafted whole anyway), on much evidence as far as the mean says; never
    shorter; at z = 0 the mean's length."""
    step = (0.0, 0.13, 0.19, 0.25, 0.31, 0.37, 0.43, 0.49)  # 6 % of a step per draft after the first
    costs = RoundCosts(verify_s=tuple(STEP * v for v in step), tokens_per_s=1 / STEP, draft_s={"model": STEP})
    e, q = 0.56, 0.52  # DFlash on gsm8k at 4 requests, rates from the answers' first rounds
    mean_ell = best_length(e, q, 7, draft_s=0.0, costs=costs)[1]
    assert mean_ell == 4  # 0.56·0.52^k beats 0.06 while k <= 3
    thin = explored_length(e, q, 3.0, 7, costs=costs, config=PayoffConfig())
    assert thin > mean_ell
    assert thin == best_length(e, wilson_upper(q, 3.0, 1.0), 7, draft_s=0.0, costs=costs)[1]
    assert explored_length(e, q, 1e5, 7, costs=costs, config=PayoffConfig()) == mean_ell
    assert explored_length(e, q, 3.0, 7, costs=costs, config=PayoffConfig(explore=0.0)) == mean_ell
    assert explored_length(e, q, 3.0, 2, costs=costs, config=PayoffConfig()) == 2  # the cap holds
    lengths = [explored_length(e, q, n, 7, costs=costs, config=PayoffConfig()) for n in (1, 3, 10, 100, 1e4)]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] > lengths[-1]


def test_a_concave_cost_curve_buys_longer_blocks():
    """Verifying the first draft costs 13 % of a step, the next six 3 % each (a CPU's curve):
    pricing every token at the first one's 13 % would stop at ℓ = 3; the whole curve says 6."""
    concave = (0.0, 0.13, 0.16, 0.19, 0.22, 0.25, 0.28, 0.31)
    costs = RoundCosts(verify_s=tuple(STEP * v for v in concave), tokens_per_s=1 / STEP, draft_s={})
    gain, ell = best_length(0.4, 0.6, 7, draft_s=0.0, costs=costs)
    assert ell == 6  # increments 0.4·0.6^k beat 0.03 while k <= 5
    assert gain == pytest.approx(expected_accepted(0.4, 0.6, 6) - 0.28)


def test_the_model_is_still_probed_while_the_free_ngram_pays():
    """A stale bad verdict on the model must not stick while the lookup carries the request."""
    c = controller_with({"model": [(7, 0)] * 6, "ngram": [(7, 3)] * 6}, probe_every=4, probe_max=4)
    choices = [c.decide({"ngram": 7, "model": 7}, COSTS, shadowed=("ngram",)) for _ in range(12)]
    assert [ch.proposer for ch in choices].count("ngram") == 9
    probes = [i for i, ch in enumerate(choices) if ch.probe]
    assert probes == [3, 7, 11] and all(choices[i].proposer == "model" for i in probes)


def test_a_new_request_starts_from_the_pooled_rates():
    """With the others' experience (the model rarely accepted) as the prior, a fresh request does
    not pay for a full model block before its own history says so; with the default prior it does."""
    fresh = PayoffController()
    assert fresh.decide({"model": 7}, COSTS).proposer == "model"
    assert PayoffController().decide({"model": 7}, COSTS, priors={"model": (0.1, 0.3)}).proposer is None


def test_a_proposer_never_accepted_tends_to_zero_acceptance():
    """The prior's pseudo-rounds fade with the evidence: no floor set by the optimistic prior."""
    c = controller_with({"ngram": [(7, 0)] * 60}, prior_strength=2.0)
    e, _ = c.record("ngram").rates(c.config)
    assert e < 0.01


def test_one_miss_does_not_stop_a_drafter_the_pool_says_pays():
    """The pooled rates of every request (evidence) hold a request's first rounds steady: a
    converged drafter's request whose first proposal is rejected keeps drafting."""
    c = controller_with({"model": [(7, 0)]})
    pooled = {"model": (0.8, 0.7)}
    assert c.decide({"model": 7}, COSTS, priors=pooled).proposer == "model"
    weak = controller_with({"model": [(7, 0)]}, pool_strength=0.1)
    assert weak.decide({"model": 7}, COSTS, priors=pooled).proposer is None


def test_the_pooled_rates_keep_their_weight_where_the_config_prior_fades():
    """After many rounds a request's own misses still sit beside the pool's evidence (at c >= 4
    a request's ~10 decayed rounds alone are noise), while the config's guess is gone."""
    c = controller_with({"model": [(7, 0)] * 60})
    e_pooled, _ = c.record("model").rates(c.config, prior=(0.8, 0.7))
    own = c.record("model").first_tested  # ~10 decayed rounds
    assert e_pooled == pytest.approx(4 * 0.8 / (own + 4))  # pool_strength 4 pseudo-rounds
    assert c.record("model").rates(c.config)[0] < 0.01


def test_a_shared_drafter_call_pays_only_from_the_sum_of_its_requests_gains():
    assert shared_call_pays([0.3, 0.3, -0.5], call_s=0.5, tokens_per_s=1.0)  # 0.6 > 0.5: losers left out
    assert not shared_call_pays([0.2, 0.2], call_s=0.5, tokens_per_s=1.0)
    assert not shared_call_pays([], call_s=0.0, tokens_per_s=1.0)


def test_a_verifying_steps_fixed_part_pays_only_from_the_drafting_requests_best_gains():
    """ρ = 1 token/s, so seconds are tokens. Each request drafts with its best proposer where
    that gain is positive; a drafter call used by any of them is charged once."""
    inf = float("-inf")
    gains = {"ngram": [0.3, inf, -0.2], "model": [0.1, 0.5, -0.1]}  # best: ngram 0.3, model 0.5

    def pays(j: float, call: float = 0.0) -> bool:
        costs = RoundCosts(verify_s=(0.0, 0.1), tokens_per_s=1.0, draft_s={}, verify_call_s=j)
        return verification_pays(gains, costs, {"model": call})

    assert pays(0.0) and pays(0.79) and not pays(0.81)  # 0.3 + 0.5 = 0.8
    assert pays(0.5, call=0.29) and not pays(0.5, call=0.31)  # the model's call comes off first
    assert not pays(0.1, call=0.8)
    assert pays(0.0, call=5.0)  # no fixed part: the shared call is judged apart (shared_call_pays)


def test_a_blocked_proposer_is_not_drafted_with_but_still_probed():
    """The batch did not repay the model's call: the request falls back to the free n-gram that
    pays, and probes the model on the probe clock as it would any unprofitable proposer."""
    c = controller_with({"model": [(7, 6)] * 6, "ngram": [(7, 3)] * 6}, probe_every=4, probe_max=4)
    caps = {"ngram": 7, "model": 7}
    assert c.decide(caps, COSTS, shadowed=("ngram",)).proposer == "model"  # it pays alone
    choices = [c.decide(caps, COSTS, shadowed=("ngram",), blocked=("model",)) for _ in range(8)]
    assert [ch.proposer for ch in choices] == ["ngram"] * 3 + ["model"] + ["ngram"] * 3 + ["model"]
    assert all(ch.probe for ch in choices if ch.proposer == "model")
    alone = controller_with({"model": [(7, 6)] * 6}, probe_every=4)
    assert alone.decide({"model": 7}, COSTS, blocked=("model",)).proposer is None


def test_realism_is_the_decayed_ratio_of_accepted_to_expected_shrunk_to_one():
    r = Realism()
    assert r.factor(8.0) == 1.0  # no evidence: the acceptance model is taken as it is
    for _ in range(400):  # chosen rounds expected 3 drafts and got 1.5: a model twice too hopeful
        r.observe(3.0, 1.5, 0.99)
    assert r.factor(8.0) == pytest.approx((150.0 + 8.0) / (300.0 + 8.0), rel=1e-3)
    assert 0.5 < r.factor(8.0) < 0.53
    assert r.factor(0.0) == 1.0  # strength 0: scaling off
    pessimistic = Realism()
    pessimistic.observe(2.0, 5, 0.99)
    assert pessimistic.factor(8.0) == pytest.approx(13.0 / 10.0)  # under-promising models are raised too


def test_a_realism_scale_prices_the_first_draft_rate_times_the_factor():
    c = controller_with({"model": [(7, 3)] * 6})
    e, q = c.record("model").rates(c.config)
    scaled = c.gains({"model": 7}, COSTS, scales={"model": 0.6})["model"]
    assert scaled == best_length(e * 0.6, q, 7, draft_s=COSTS.draft_s["model"], costs=COSTS)
    assert scaled[0] < c.gains({"model": 7}, COSTS)["model"][0]
    # a scale never prices a first draft above certainty
    capped = c.gains({"model": 7}, COSTS, scales={"model": 10.0})["model"]
    assert capped == best_length(1.0, q, 7, draft_s=COSTS.draft_s["model"], costs=COSTS)
    # decide uses the scales as well: a drafter that pays as estimated does not once scaled down
    assert c.decide({"model": 7}, COSTS).proposer == "model"
    assert (
        PayoffController(config=c.config, records=c.records)
        .decide({"model": 7}, COSTS, scales={"model": 0.1})
        .proposer
        is None
    )


def test_a_drains_value_of_an_accepted_draft_runs_from_its_row_to_one_over_rho():
    """``drain_value``: ``(b·R + share·a) / (a + b·R)`` of ``1/ρ``: the whole batch drafting
    (share 1) is ``1/ρ``'s value; nobody else drafting leaves only the request's own row."""
    a, b, R = 0.028, 0.0016, 16  # the tiny target's step line at 16 requests (seconds)
    assert drain_value(a, b, R, 1.0) == pytest.approx(1.0)
    assert drain_value(a, b, R, 0.0) == pytest.approx(b * R / (a + b * R))  # 0.48
    assert drain_value(a, b, R, 0.5) == pytest.approx((b * R + 0.5 * a) / (a + b * R))
    shares = [0.0, 0.2, 0.6, 1.0]
    values = [drain_value(a, b, R, x) for x in shares]
    assert values == sorted(values) and values[0] < values[-1]
    assert drain_value(a, b, 4, 0.0) < drain_value(a, b, 64, 0.0)  # the fixed part weighs less at 64
    assert drain_value(a, b, 1, 0.0) == 1.0  # one request is the whole batch
    assert drain_value(a, b, R, 7.0) == 1.0 and drain_value(a, b, R, -1.0) == values[0]  # clamped
    assert drain_value(0.0, 0.0, R, 0.0) == 1.0  # no step line yet
