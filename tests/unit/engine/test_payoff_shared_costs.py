"""Costs the requests of a round share, in the engine's payoff plan: a drafter call the batch
does not repay is blocked (judged on the pooled bound) and joined where a probe pays it; a
step in which anybody verifies is gated on its fixed part and joined the same way; a batch
that drains drafts together or not at all. Hand-made histories and timing tables; no wall
clock (the pricing clock is frozen)."""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import numpy as np
import pytest

from dspark.engine.payoff_drafting import PayoffDrafting
from dspark.engine.payoff_plan import MODEL, NGRAM
from dspark.scheduler.payoff import (
    PLAIN,
    AcceptanceRecord,
    Choice,
    PayoffConfig,
    PayoffController,
    best_length,
    upper_rates,
)
from dspark.scheduler.payoff_batch import join_probe_call, join_verifying_step
from dspark.scheduler.shared_costs import drain_value

from .conftest import VOCAB
from .drafters import NoisyOracleDrafter
from .test_payoff_plan import requests


def test_requests_that_gain_join_a_blocked_model_call_a_probe_pays_for():
    """The batch does not repay the model's shared call, but one request probes it anyway:
    the requests whose own gain with the model is positive and beats their choice draft too."""
    inf = float("-inf")
    gains = {
        MODEL: (np.array([-0.5, 0.3, 0.2, -0.1, 0.6]), np.array([2, 4, 5, 3, 6])),
        NGRAM: (np.array([inf, -1.0, 0.4, inf, 0.1]), np.array([0, 1, 3, 0, 2])),
    }

    def run(first: Choice) -> tuple[list[Choice], list[PayoffController]]:
        ctrls = [
            PayoffController(config=PayoffConfig(probe_every=4), skipped=3, interval=16) for _ in range(5)
        ]
        choices = [first, PLAIN, Choice(NGRAM, 3), PLAIN, Choice(NGRAM, 2)]
        join_probe_call(choices, ctrls, gains, MODEL)
        return choices, ctrls

    choices, ctrls = run(Choice(MODEL, 2, probe=True))
    assert choices == [
        Choice(MODEL, 2, probe=True),
        Choice(MODEL, 4),
        Choice(NGRAM, 3),
        PLAIN,
        Choice(MODEL, 6),
    ]
    assert [(c.skipped, c.interval) for c in ctrls] == [(3, 16), (0, 4), (3, 16), (3, 16), (0, 4)]
    choices, _ = run(PLAIN)  # no probe: the call is not made, nobody joins
    assert choices == [PLAIN, PLAIN, Choice(NGRAM, 3), PLAIN, Choice(NGRAM, 2)]


def test_a_shared_call_is_judged_on_the_pooled_bound_which_ages_while_nobody_drafts(sps):
    """Exploration (``PayoffConfig.explore``, ``pool_aging``): two requests without evidence of
    their own each gain by drafting at the pooled means, but less than the model's shared call
    costs. On six pooled rounds its upper confidence bound repays the call and both draft
    (each on its mean); on 100 (``POOL_MEMORY``'s span) the bound does not, until rounds in
    which nobody observed the model have widened it again (never without aging, nor while
    outcomes keep coming in)."""
    rng = random.Random(5)

    def payoff_and_requests(n: float, *, explore: float = 1.0, aging: float = 0.95, bounded_n: float = 0.0):
        config = PayoffConfig(explore=explore, pool_aging=aging, probe_every=64, probe_max=64)
        payoff = PayoffDrafting(
            NoisyOracleDrafter({}, VOCAB), VOCAB, 7, sps, choose_proposer=False, config=config,
            draft_costs={MODEL: 0.0},
        )  # fmt: skip
        payoff.clock = lambda: 0.0
        pool = payoff.pooled[MODEL] = AcceptanceRecord(n, 0.5 * n, n, 0.5 * n, rounds=1000)  # e = q = 0.5
        costs = payoff.costs(2)
        mean = best_length(0.5, 0.5, 7, draft_s=0.0, costs=costs)[0]
        assert mean > 0
        # the call costs what two requests gain at the bound on ``bounded_n`` rounds, and 0.02 tokens more
        # (default: halfway between what they gain at the means and at the bound, z = 1, on n rounds)
        if bounded_n:
            bound = upper_rates(
                AcceptanceRecord(bounded_n, 0.5 * bounded_n, bounded_n, 0.5 * bounded_n, rounds=1000), config
            )
            call = 2 * best_length(*bound, 7, draft_s=0.0, costs=costs)[0] + 0.02
        else:
            call = mean + best_length(*upper_rates(pool, PayoffConfig()), 7, draft_s=0.0, costs=costs)[0]
        payoff.model_call_s = lambda R: call / costs.tokens_per_s
        reqs = requests(rng, 2, config)
        for req in reqs:
            req.payoff, req.shadow = PayoffController(config=config), None
            req.max_new = len(req.generated) + 64
        return payoff, reqs

    for explore, n, want in ((0.0, 6.0, None), (1.0, 6.0, MODEL)):
        payoff, reqs = payoff_and_requests(n, explore=explore)
        choices, _ = payoff.plan(reqs, 7)
        assert [c.proposer for c in choices] == [want, want], (explore, n)
    assert reqs[0].payoff.expecting == (MODEL, pytest.approx(0.5), pytest.approx(0.5))  # the means

    def first_model_round(aging: float, observe: bool = False) -> int | None:
        payoff, reqs = payoff_and_requests(100.0, aging=aging, bounded_n=100.0)
        for i in range(60):
            if observe:  # someone drafted with it: e = q = 0.5 still
                payoff._observe(SimpleNamespace(payoff=PayoffController()), MODEL, 3, 2 * (i % 2))
            choices, _ = payoff.plan(reqs, 7)
            if any(c.proposer == MODEL for c in choices):
                return i
        return None

    aged = first_model_round(0.95)
    assert aged is not None and aged > 0
    assert first_model_round(1.0) is None
    assert first_model_round(0.95, observe=True) is None


def test_a_draining_batch_drafts_together_or_not_at_all(sps):
    """While a batch drains (``Engine.generate``: nobody queued) an accepted draft is valued by
    ``drain_value`` at the share of the batch whose drafts would pay at ``1/ρ``: requests
    whose drafts pay at ``1/ρ`` draft while that share is high, and not once it has fallen
    (alone, an accepted draft saves its row, ``b``, and a verified one costs as much); the
    share follows what ``1/ρ`` would say, not what the round was priced at, so a batch that
    turns predictable drafts together again; a batch that does not drain keeps ``1/ρ``."""
    config = PayoffConfig(probe_every=64, probe_max=64)

    def plan(draining: bool, share: float, accepted: int) -> tuple[list[str | None], PayoffDrafting]:
        payoff = PayoffDrafting(
            NoisyOracleDrafter({}, VOCAB), VOCAB, 7, sps, choose_proposer=False, config=config,
            draft_costs={MODEL: 0.0},
        )  # fmt: skip
        payoff.clock = lambda: 0.0
        payoff.draining, payoff.paying_share = draining, share
        reqs = requests(random.Random(3), 8, config)
        for req in reqs:
            req.payoff, req.shadow = PayoffController(config=config), None
            req.max_new = len(req.generated) + 64
            for _ in range(20):
                req.payoff.observe(MODEL, 7, accepted)
        payoff.pooled[MODEL] = copy.deepcopy(reqs[0].payoff.record(MODEL))  # every request tries it
        return [c.proposer for c in payoff.plan(reqs, 7)[0]], payoff

    _, payoff = plan(True, 0.0, 0)
    costs = payoff.costs(8)
    b = costs.verify_s[1]
    a = 8 / costs.tokens_per_s - 8 * b
    assert 0.2 < drain_value(a, b, 8, 0.0) < 0.9  # a fair fixed part at 8 requests
    for accepted, pays in ((0, False), (1, True), (5, True)):
        assert plan(False, 0.0, accepted)[0] == [MODEL if pays else None] * 8, accepted  # 1/ρ's value
        assert plan(True, 1.0, accepted)[0] == [MODEL if pays else None] * 8, accepted  # together
        drafted, low = plan(True, 0.0, accepted)
        assert drafted == [None] * 8, accepted  # alone a row never repays the verification
        m = config.drain_share_memory  # ... and the share recovers where 1/ρ says drafting pays
        assert low.paying_share == pytest.approx((1 - m) * pays), accepted
    assert plan(True, 0.5, 5)[1].paying_share == pytest.approx(0.5 * m + (1 - m))


def test_requests_that_gain_join_a_step_a_probe_verifies_in():
    """The batch does not repay a verifying step's fixed part, but one request probes anyway:
    every plain request whose own gain with a proposer it may use is positive drafts with the
    best (the model only if somebody calls it this round)."""
    inf = float("-inf")
    gains = {
        MODEL: (np.array([-0.5, 0.3, 0.2, -0.1, 0.6]), np.array([2, 4, 5, 3, 6])),
        NGRAM: (np.array([inf, -1.0, 0.4, inf, 0.1]), np.array([0, 1, 3, 0, 2])),
    }

    def run(first: Choice, blocked: tuple[str, ...]) -> list[Choice]:
        ctrls = [PayoffController(config=PayoffConfig(probe_every=4), skipped=3) for _ in range(5)]
        choices = [first, PLAIN, PLAIN, PLAIN, PLAIN]
        join_verifying_step(choices, ctrls, gains, blocked)
        assert [c.skipped for c in ctrls] == [3 if c in (PLAIN, first) else 0 for c in choices]
        return choices

    probe = Choice(MODEL, 2, probe=True)
    assert run(probe, ()) == [probe, Choice(MODEL, 4), Choice(NGRAM, 3), PLAIN, Choice(MODEL, 6)]
    assert run(probe, (MODEL,)) == run(probe, ())  # the probe calls the model: its call is paid
    n_probe = Choice(NGRAM, 1)  # a request drafting with the free n-gram; the model's call stays blocked
    assert run(n_probe, (MODEL,)) == [n_probe, PLAIN, Choice(NGRAM, 3), PLAIN, Choice(NGRAM, 2)]
    assert run(PLAIN, ()) == [PLAIN] * 5  # nobody verifies: nobody pays the step's fixed part


@pytest.mark.parametrize("small_batch", [0, 64])  # plan_batch, plan_each
def test_a_batch_that_does_not_repay_a_verifying_steps_fixed_part_decodes_plainly(sps, small_batch):
    """Steps of 8 requests observed at 20 ms + 0.2 ms per extra row, plus ``jump`` in any step
    that verifies (``StepTimes.step_model``'s ``j``). Requests whose drafts pay at the rows'
    price draft together while the jump is small, decode plainly where their gains together
    do not repay it, and join a probe that pays it anyway."""
    config = PayoffConfig(probe_every=4, probe_max=64, probe_budget=1.0)

    def plan(jump: float, skipped: int = 0) -> tuple[list[Choice], PayoffDrafting]:
        payoff = PayoffDrafting(
            NoisyOracleDrafter({}, VOCAB), VOCAB, 7, sps, choose_proposer=False, config=config,
            draft_costs={MODEL: 0.0},
        )  # fmt: skip
        payoff.clock, payoff.small_batch = (lambda: 0.0), small_batch
        for extra in (0, 4, 0, 9, 20, 0, 14, 30, 0, 6) * 3:
            payoff.step_times.observe(8 + extra, 0.020 + 0.0002 * extra + jump * (extra > 0), 8)
        reqs = requests(random.Random(5), 8, config)
        for i, req in enumerate(reqs):
            req.payoff, req.shadow = PayoffController(config=config, skipped=skipped if i == 0 else 0), None
            req.max_new = len(req.generated) + 64
            for _ in range(20):
                req.payoff.observe(MODEL, 7, 1)  # one draft in 7 accepted: a small gain
        payoff.pooled[MODEL] = copy.deepcopy(reqs[0].payoff.record(MODEL))
        return payoff.plan(reqs, 7)[0], payoff

    choices, payoff = plan(0.0)
    assert payoff.costs(8).verify_call_s == pytest.approx(0.0, abs=1e-4)
    assert [c.proposer for c in choices] == [MODEL] * 8 and not any(c.probe for c in choices)
    choices, payoff = plan(0.040)
    assert payoff.costs(8).verify_call_s == pytest.approx(0.040, rel=0.15)
    assert choices == [PLAIN] * 8
    # a lone probe pays the jump (ρ·j ≈ 15 tokens): due after 15 rounds at probe_budget 1. The
    # first request's falls due and the others join it
    assert plan(0.040, skipped=10)[0] == [PLAIN] * 8
    choices, _ = plan(0.040, skipped=20)
    assert choices[0].probe and all(c.proposer == MODEL and not c.probe for c in choices[1:]), choices
