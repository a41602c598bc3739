"""The batch gains of ``scheduler/payoff_batch.py`` equal the per-request formulas of
``scheduler/payoff.py`` on hand-made histories and timing tables (issue 17's floor)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from dspark.scheduler.payoff import (
    AcceptanceRecord,
    PayoffConfig,
    PayoffController,
    RoundCosts,
    best_length,
    probe_cost,
    probe_value,
)
from dspark.scheduler.payoff_batch import (
    QUIET_FOREVER,
    batch_best_length,
    batch_net,
    batch_probe_cost,
    batch_probe_value,
    batch_rates,
    quiet_margin,
)


def records(seed: int, n: int) -> list[AcceptanceRecord | None]:
    rng = random.Random(seed)
    out: list[AcceptanceRecord | None] = [None]
    for _ in range(n):
        r = AcceptanceRecord()
        for _ in range(rng.randrange(0, 12)):
            verified = rng.randrange(0, 8)
            r.observe(verified, rng.randrange(0, verified + 1), memory=0.9)
        out.append(r)
    return out


@pytest.mark.parametrize("prior", [None, (0.3, 0.6)])
def test_batch_rates_equal_each_records_rates(prior):
    config = PayoffConfig()
    recs = records(1, 30)
    e, q = batch_rates(recs, config, prior)
    for i, rec in enumerate(recs):
        assert (e[i], q[i]) == pytest.approx((rec or AcceptanceRecord()).rates(config, prior), rel=1e-12)


@pytest.mark.parametrize(
    "verify_s",
    [
        tuple(0.0005 * ell for ell in range(8)),  # linear: 5 % of a 10 ms step per token
        (0.0, 0.004, 0.0045, 0.0047, 0.0048, 0.006, 0.0061, 0.0062),  # a concave staircase
    ],
)
def test_batch_best_length_equals_best_length(verify_s):
    rng = random.Random(2)
    costs = RoundCosts(verify_s=verify_s, tokens_per_s=100.0, draft_s={})
    R = 200
    e = np.array([rng.random() for _ in range(R)])
    q = np.array([rng.random() for _ in range(R)])
    caps = np.array([rng.randrange(-1, 10) for _ in range(R)])
    draft_s = np.array([rng.random() * 0.01 for _ in range(R)])
    gain, ell = batch_best_length(e, q, caps, draft_s, costs, margin=1.3)
    for i in range(R):
        g, k = best_length(e[i], q[i], int(caps[i]), draft_s=draft_s[i], costs=costs, margin=1.3)
        assert int(ell[i]) == k
        assert gain[i] == (pytest.approx(g, rel=1e-9, abs=1e-12) if k else float("-inf"))


def test_batch_probe_cost_equals_probe_cost():
    rng = random.Random(4)
    costs = RoundCosts(verify_s=tuple(0.0005 * ell for ell in range(8)), tokens_per_s=100.0, draft_s={})
    R = 300
    e = np.array([rng.random() for _ in range(R)])
    q = np.array([rng.random() for _ in range(R)])
    draft_s = np.array([rng.choice([0.0, 0.002, 0.01, 0.08]) * rng.random() for _ in range(R)])
    for length in (1, 2, 9):
        got = batch_probe_cost(
            batch_net(e, q, costs, 1.3), length, draft_s=draft_s, call_s=0.003, costs=costs, margin=1.3
        )
        want = [
            probe_cost(e[i], q[i], length, draft_s=draft_s[i], call_s=0.003, costs=costs, margin=1.3)
            for i in range(R)
        ]
        assert got.tolist() == pytest.approx(want, rel=1e-12, abs=1e-12)
        assert np.isinf(got).any() and (got == 0).any() and ((got > 0) & np.isfinite(got)).any()


def test_a_quiet_margin_counts_the_rounds_decide_keeps_plain_before_a_probe():
    """``quiet_margin`` is -1 iff ``decide`` drafts or probes now; m ≥ 0 iff it returns plain
    decoding and only counts the skipped round, and, with the same gains and prices, does so
    for the next m rounds and probes in the one after (never, for ``QUIET_FOREVER``)."""
    rng = random.Random(3)
    costs = RoundCosts(verify_s=tuple(0.0005 * ell for ell in range(8)), tokens_per_s=100.0, draft_s={})
    seen = set()
    for trial in range(400):
        ctrl = PayoffController(config=PayoffConfig(probe_every=4, value_probes=rng.random() < 0.7))
        ctrl.skipped, ctrl.interval = rng.randrange(0, 8), rng.choice([0, 4, 8])
        gains = {
            "ngram": rng.choice([float("-inf"), -0.5, 0.2]),
            "model": rng.choice([float("-inf"), -0.1, 0.3]),
        }
        blocked = rng.choice([(), ("model",)])
        probe = rng.choice([None, 0.0, 0.05, 0.11, 0.2, float("inf")])  # waits 0 to 10 rounds, never
        probes = {} if probe is None else {"model": probe}
        value = rng.choice([None, 0.0, 0.1, 1.0])  # below, near or above the probe's cost
        values = {} if value is None else {"model": value}
        margin = quiet_margin(
            {n: np.array([g]) for n, g in gains.items()},
            probeable=["model"],
            blocked=blocked,
            skipped=np.array([ctrl.skipped]),
            interval=np.array([ctrl.interval or ctrl.config.probe_every]),
            probe_costs={n: np.array([c]) for n, c in probes.items()},
            probe_values={n: np.array([v]) for n, v in values.items()},
            config=ctrl.config,
        )[0]
        caps = {n: 0 if g == float("-inf") else 3 for n, g in gains.items()}
        own = {n: (g, 2) for n, g in gains.items() if caps[n] >= 1}
        plain_rounds = 0
        for _ in range(min(int(margin), 40) + 2):
            before = ctrl.skipped
            choice = ctrl.decide(
                caps, costs, shadowed=("ngram",), blocked=blocked, gains=own, probe_costs=probes,
                probe_values=values,
            )  # fmt: skip
            if not (choice.proposer is None and ctrl.skipped == before + 1):
                break
            plain_rounds += 1
        expected = 42 if margin == QUIET_FOREVER else margin + 1
        assert plain_rounds == expected, (trial, gains, blocked, probes, values, margin)
        seen.add(min(int(margin), 3))
    assert seen == {-1, 0, 1, 2, 3}  # drafting now, and quiet for a few rounds or many


@pytest.mark.parametrize("prior", [None, (0.3, 0.6)])
def test_batch_probe_value_equals_the_scalar_one(prior):
    """A probe's value per row: both outcomes' updated gains, weighted by the row's rate now."""
    config = PayoffConfig()
    recs = records(11, 40)
    costs = RoundCosts(verify_s=tuple(0.0004 * ell for ell in range(8)), tokens_per_s=100.0, draft_s={})
    rng = random.Random(5)
    caps = np.array([rng.randrange(0, 8) for _ in recs])
    horizon = np.array([float(rng.randrange(1, 60)) for _ in recs])
    draft_s = np.array([rng.choice([0.0, 0.002, 0.006]) for _ in recs])
    e, _ = batch_rates(recs, config, prior)
    got = batch_probe_value(recs, e, caps, horizon, draft_s=draft_s, costs=costs, config=config, prior=prior)
    want = []
    for rec, cap, h, d, e_now in zip(recs, caps, horizon, draft_s, e, strict=True):
        rec = rec or AcceptanceRecord()
        after = [
            best_length(
                *rec.after_probe(hit, config.memory).rates(config, prior), int(cap), draft_s=d, costs=costs
            )[0]
            for hit in (True, False)
        ]
        want.append(probe_value(float(e_now), *after, float(h)))
    assert got.tolist() == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert (got == 0).any() and (got > 0).any()  # some probes could show a paying drafter, some not


def test_a_probe_tells_more_through_a_pool_that_holds_little():
    """The pooled value of one probe is summed over the requests the pool informs, and
    falls as the pool's evidence grows (each outcome moves it less)."""
    from dspark.scheduler.payoff_batch import pooled_probe_value

    config = PayoffConfig()
    costs = RoundCosts(verify_s=tuple(0.0004 * ell for ell in range(8)), tokens_per_s=100.0, draft_s={})

    def value(pool_rounds: int, rows: int) -> float:
        pool = AcceptanceRecord()
        for i in range(pool_rounds):  # a pool near break-even: half the first drafts accepted
            pool.observe(2, i % 2, 0.99)
        return pooled_probe_value(
            pool, [None] * rows, np.full(rows, 7), np.full(rows, 40.0), draft_s=0.004, costs=costs,
            config=config, pool_memory=0.99,
        )  # fmt: skip

    assert value(3, 16) > 0
    assert value(3, 16) == pytest.approx(16 * value(3, 1))  # one term per informed request
    assert value(3, 16) > 1000 * value(30, 16) > 0  # more evidence, less to learn
    assert value(300, 16) == pytest.approx(0.0, abs=1e-9)


def test_a_model_round_verifies_two_drafts_so_its_later_rate_stays_observable():
    from dspark.scheduler.payoff import Choice
    from dspark.scheduler.payoff_batch import keep_q_observable

    choices = [Choice("model", 1), Choice("model", 1), Choice("model", 1, probe=True), Choice("ngram", 1),
               Choice(None), Choice("model", 5)]  # fmt: skip
    keep_q_observable(choices, np.array([7, 1, 7, 7, 7, 7]), "model")
    assert choices[:3] == [Choice("model", 2), Choice("model", 1), Choice("model", 1, probe=True)]
    assert choices[3:] == [Choice("ngram", 1), Choice(None), Choice("model", 5)]
    keep_q_observable(choices, None, "model")  # no model drafter: nothing to do
