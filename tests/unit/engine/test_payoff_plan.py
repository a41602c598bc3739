"""The engine's vectorised payoff plan makes the same decisions, request by request, as
:meth:`PayoffController.decide` called for each request (the plan before issue 17's floor
work), on hand-made histories and timing tables; no wall clock (the pricing clock is frozen)."""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import numpy as np
import pytest

from dspark.drafters.ngram import lookup
from dspark.engine.payoff_drafting import SHADOW_EVERY, PayoffDrafting
from dspark.engine.payoff_plan import MODEL, NGRAM, POOL_MEMORY
from dspark.engine.requests import Request
from dspark.protocols import SamplingParams, SequenceState
from dspark.scheduler import FirstAcceptPredictor
from dspark.scheduler.payoff import (
    Choice,
    PayoffConfig,
    PayoffController,
    RoundCosts,
    best_length,
    probe_cost,
    probe_value,
    upper_rates,
    wilson_upper,
)
from dspark.scheduler.shared_costs import shared_call_pays, verification_pays

from .conftest import VOCAB
from .drafters import NoisyOracleDrafter
from .test_engine_drafters import build


def reference_plan(payoff: PayoffDrafting, decoding: list[Request], K: int):
    """The decisions defined request by request: each request's own gains and ``decide``,
    priced with the round's config (its margin raised while the batch drains)."""
    payoff.age_pool()  # a new round (tested on its own below)
    costs = payoff.costs(len(decoding))
    config = payoff.round_config(costs, len(decoding))
    for req in decoding:
        req.payoff.config = config
    priors = {name: record.rates(payoff.config) for name, record in payoff.pooled.items()}
    scales = payoff.scales()

    def priced_rates(record, prior, name=MODEL):
        e, q = record.rates(payoff.config, prior)
        return min(1.0, e * scales.get(name, 1.0)), q

    lookups, every_caps, every_costs = {}, [], []
    for req in decoding:
        n = min(K, max(req.draft_budget, 0))
        if payoff.ngram is not None:
            hopeless = n > 0 and req.payoff.gains({NGRAM: n}, costs, priors, scales)[NGRAM][0] <= 0
            due = req.shadow is None and len(req.generated) % SHADOW_EVERY == 0
            c = payoff.ngram.config
            skip = n == 0 or (hopeless and not due)
            lookups[req.id] = [] if skip else lookup(np.asarray(req.state.token_ids), n, c.min_n, c.max_n)
        own = costs
        if payoff.model is not None and MODEL in costs.draft_s and payoff.sync_line.w:
            d = costs.draft_s[MODEL] + float(payoff.catch_up_charge([req])[0])
            own = RoundCosts(
                verify_s=costs.verify_s, tokens_per_s=costs.tokens_per_s, draft_s={**costs.draft_s, MODEL: d}
            )
        every_costs.append(own)
        caps = {NGRAM: len(lookups[req.id])} if payoff.ngram is not None else {}
        if payoff.model is not None:  # not in a first round, for a drafter that cannot draft there
            caps[MODEL] = n if req.generated or payoff.model_after_prompt else 0
        every_caps.append(caps)
    tried = MODEL in payoff.pooled
    call_s = payoff.model_call_s(len(decoding)) if tried else 0.0
    blocked = ()
    if call_s > 0:  # judged on the model's pooled upper bound
        bounds = {**priors, MODEL: upper_rates(payoff.pooled[MODEL], payoff.config)}
        every_gains = [
            r.payoff.gains(c, o, bounds, scales) for r, c, o in zip(decoding, every_caps, every_costs)
        ]
        model = [
            g[MODEL][0] for g in every_gains if MODEL in g and g[MODEL][0] >= max(v[0] for v in g.values())
        ]
        blocked = () if shared_call_pays(model, call_s, costs.tokens_per_s) else (MODEL,)
    # the step's fixed part of verification, judged on the same gains (the model's at its bound)
    names = list(every_caps[0]) if every_caps else []
    judged = [
        r.payoff.gains(c, o, bounds if call_s > 0 else priors, scales)
        for r, c, o in zip(decoding, every_caps, every_costs)
    ]
    usable = {n: [g.get(n, (-np.inf, 0))[0] for g in judged] for n in names if n not in blocked}
    gated = not verification_pays(usable, costs, {MODEL: call_s})
    probe_step_s = costs.verify_call_s if gated else 0.0
    every_probes, every_values = [], []
    for req, caps, own in zip(decoding, every_caps, every_costs):
        probes, values = {}, {}
        if MODEL in caps:
            record, prior, d = req.payoff.record(MODEL), priors.get(MODEL), own.draft_s.get(MODEL, 0.0)
            e, q = priced_rates(record, prior)
            probes[MODEL] = probe_cost(
                e,
                q,
                config.probe_length,
                draft_s=d,
                call_s=call_s,
                costs=own,
                margin=config.margin,
                step_s=probe_step_s,
            )
            after = [
                best_length(
                    *priced_rates(record.after_probe(hit, config.memory), prior),
                    caps[MODEL], draft_s=d, costs=own, margin=config.margin,
                )[0]
                for hit in (True, False)
            ]  # fmt: skip
            hit_chance = record.rates(config, prior)[0]  # a probe's first draft: unscaled
            values[MODEL] = probe_value(hit_chance, *after, max(req.draft_budget + 1, 1))
        every_probes.append(probes)
        every_values.append(values)
    if tried and payoff.model is not None:  # what one probe tells every request through the pool
        pool = payoff.pooled[MODEL]
        e_pool = pool.rates(config)[0]

        def gain(req, caps, own, prior):
            d = own.draft_s.get(MODEL, 0.0)
            g = best_length(
                *priced_rates(req.payoff.record(MODEL), prior), caps[MODEL], draft_s=d, costs=own,
                margin=config.margin,
            )[0]  # fmt: skip
            return max(g, 0.0)

        public = 0.0
        for req, caps, own in zip(decoding, every_caps, every_costs):
            hit, miss = (pool.after_probe(h, POOL_MEMORY).rates(config) for h in (True, False))
            now = gain(req, caps, own, pool.rates(config))
            later = e_pool * gain(req, caps, own, hit) + (1 - e_pool) * gain(req, caps, own, miss)
            public += max(req.draft_budget + 1, 1) * max(0.0, later - now)
        due = [
            i
            for i, (req, caps, own) in enumerate(zip(decoding, every_caps, every_costs))
            if req.payoff.skipped + 1 >= (req.payoff.interval or config.probe_every)
            and caps[MODEL] >= 1
            and req.payoff.gains(caps, own, priors, scales)[MODEL][0] <= 0
            and every_probes[i][MODEL] < float("inf")
        ]
        if due:
            i = min(due, key=lambda i: every_probes[i][MODEL])
            every_values[i][MODEL] = max(every_values[i][MODEL], public)
    choices = []
    for req, caps, own, probes, values in zip(decoding, every_caps, every_costs, every_probes, every_values):
        if not tried and any(c.proposer == MODEL for c in choices):
            caps = {**caps, MODEL: 0}
        choice = req.payoff.decide(
            caps, own, shadowed=(NGRAM,), priors=priors, blocked=tuple(names) if gated else blocked,
            probe_costs=probes, probe_values=values, scales=scales,
        )  # fmt: skip
        choices.append(choice)
    if blocked and any(c.probe and c.proposer == MODEL for c in choices):  # the call is paid anyway
        for i, (req, caps, own) in enumerate(zip(decoding, every_caps, every_costs)):
            g = req.payoff.gains(caps, own, priors, scales)  # its own rates, not the bound
            rival = max([0.0] + [v[0] for name, v in g.items() if name != MODEL])
            if choices[i].proposer != MODEL and MODEL in g and g[MODEL][0] > rival:
                choices[i] = req.payoff.drafts(MODEL, g[MODEL][1])
    calling = {c.proposer for c in choices} - {None}
    if gated and calling:  # somebody verifies anyway: the step's fixed part is paid
        for i, (req, caps, own) in enumerate(zip(decoding, every_caps, every_costs)):
            g = req.payoff.gains(caps, own, priors, scales)
            g = {n: v for n, v in g.items() if n not in blocked or n in calling}
            best = max(g, key=lambda n: g[n][0], default=None)
            if choices[i].proposer is None and best is not None and g[best][0] > 0:
                choices[i] = req.payoff.drafts(best, g[best][1])
    for i, (choice, caps) in enumerate(zip(choices, every_caps)):  # q stays observable
        if choice.proposer == MODEL and not choice.probe and choice.length < min(2, caps[MODEL]):
            choices[i] = Choice(MODEL, min(2, caps[MODEL]))
    for i, (req, choice, caps) in enumerate(zip(decoding, choices, every_caps)):  # explored length
        if config.explore_lengths and choice.proposer == MODEL and not choice.probe:
            record = req.payoff.record(MODEL)
            e, q = priced_rates(record, priors.get(MODEL))
            s = (
                config.pool_strength
                if MODEL in priors
                else config.prior_strength * config.memory**record.rounds
            )
            q_up = wilson_upper(q, record.later_tested + s, config.explore)
            ell = best_length(e, q_up, caps[MODEL], draft_s=0.0, costs=costs, margin=config.margin)[1]
            choices[i] = Choice(MODEL, max(choice.length, ell))
    for req, choice in zip(decoding, choices):  # what a real round expects (Realism), unscaled
        name = choice.proposer
        real = name is not None and not choice.probe
        req.payoff.expecting = (
            (name, *req.payoff.record(name).rates(config, priors.get(name))) if real else None
        )
        if choice.proposer != NGRAM and lookups.get(req.id) and req.shadow is None:
            req.shadow = (len(req.generated), lookups[req.id])
        if choice.proposer == NGRAM:
            req.shadow = None
    paying = [  # whose drafts would pay at 1/ρ's value (the base config's margin)
        max((g for g, _ in PayoffController(config=payoff.config, records=req.payoff.records)
             .gains(caps, own, priors, scales).values()), default=0.0) > 0
        for req, caps, own in zip(decoding, every_caps, every_costs)
    ]  # fmt: skip
    if decoding:
        payoff.observe_share(sum(paying) / len(decoding))
    return choices, lookups


def requests(rng: random.Random, count: int, config: PayoffConfig | None = None) -> list[Request]:
    config = config or PayoffConfig(probe_every=4, probe_max=16)
    out = []
    for i in range(count):
        base = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(2, 9))]
        prompt = (
            (base * 6)[: rng.randrange(6, 40)]
            if rng.random() < 0.6
            else [rng.randrange(3, VOCAB) for _ in range(20)]
        )
        generated = prompt[: rng.randrange(0, 12)]
        state = SequenceState(i, prompt + generated, len(prompt))
        if rng.random() < 0.5:  # what a lazy drafter has absorbed (None: never proposed)
            state.drafter_cache = SimpleNamespace(
                context=SimpleNamespace(length=rng.randrange(0, len(prompt)))
            )
        ctrl = PayoffController(config=config)
        for name in (NGRAM, MODEL):
            for _ in range(rng.randrange(0, 10)):
                v = rng.randrange(1, 8)
                ctrl.observe(name, v, min(v, int(rng.expovariate(0.3 if name == MODEL else 1.0))))
        ctrl.skipped, ctrl.interval = rng.randrange(0, 16), rng.choice([0, 4, 8, 16])
        req = Request(
            id=i,
            params=SamplingParams(temperature=0.0, max_tokens=rng.choice([len(generated) + 1, 64])),
            state=state,
            max_new=rng.choice([len(generated) + rng.randrange(0, 4), 64]),
            generator=None,
            on_tokens=None,
            predictor=FirstAcceptPredictor(estimate=0.5),
            payoff=ctrl,
            generated=list(generated),
        )
        if rng.random() < 0.3:
            req.shadow = (max(len(generated) - 1, 0), [1, 2])
        out.append(req)
    return out


def priced(payoff: PayoffDrafting, rng: random.Random, *, measured: bool) -> None:
    """Hand-made timings: fitted step line, n-gram and model seconds, catch-up line, pooled rates."""
    payoff.clock = lambda: 0.0  # the plan times its lookups: a frozen clock keeps both plans equal
    if not measured:
        return
    jump = rng.choice([0.0, 0.002, 0.02])  # the fixed part of a step in which anybody verifies
    for rows in (4, 16, 40):
        payoff.step_times.observe(rows, 0.010 + rows * rng.uniform(0.0002, 0.0006))
        extra = rng.randrange(1, 3 * rows)
        payoff.step_times.observe(rows + extra, 0.010 + (rows + extra) * 0.0004 + jump, rows)
    payoff.draft_s[NGRAM] = rng.uniform(0.0, 0.0002)
    for n in (1, 4, 8):
        payoff.model_costs.observe(n, rng.uniform(0.001, 0.004) + n * rng.uniform(0.0001, 0.001))
    payoff.sync_line.observe(10.0, 0.0010)
    payoff.sync_line.observe(40.0, 0.0016)
    for name in rng.sample([NGRAM, MODEL], rng.randrange(0, 3)):
        for _ in range(6):
            payoff._observe(SimpleNamespace(payoff=PayoffController()), name, 4, rng.randrange(0, 5))
    for name in rng.sample([NGRAM, MODEL], rng.randrange(0, 3)):  # realised/expected of chosen rounds
        for _ in range(6):
            chosen = PayoffController(expecting=(name, rng.uniform(0.3, 0.9), rng.uniform(0.3, 0.9)))
            payoff._observe(SimpleNamespace(payoff=chosen), name, 4, rng.randrange(0, 5))


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("measured", [False, True])
@pytest.mark.parametrize("budget", [0.02, 0.001])  # 0.001: most probes wait on their value
def test_the_vectorised_plan_decides_as_each_request_would(target, sps, lazy, measured, budget):
    rng = random.Random(7 + lazy + 2 * measured)
    config = PayoffConfig(probe_every=4, probe_max=16, probe_budget=budget, value_probes=True)
    for trial in range(25):
        drafter = build("dflash", target) if lazy else NoisyOracleDrafter({}, VOCAB)
        costs = None if measured else (("model", rng.uniform(0.0, 0.3)), ("ngram", 0.0))
        payoff = PayoffDrafting(
            drafter, VOCAB, 7, sps, draft_costs=dict(costs) if costs else None, config=config
        )
        priced(payoff, rng, measured=measured)
        reqs = requests(rng, rng.choice([1, 5, 16, 40]), config)
        expected_reqs, before = copy.deepcopy(reqs), copy.deepcopy(payoff)  # the plan measures its lookups
        choices, lookups = payoff.plan(reqs, 7)
        expected_choices, expected_lookups = reference_plan(before, expected_reqs, 7)
        assert choices == expected_choices, trial
        assert lookups == expected_lookups, trial
        for got, want in zip(reqs, expected_reqs):
            assert (got.payoff.skipped, got.payoff.interval, got.shadow) == (
                want.payoff.skipped,
                want.payoff.interval,
                want.shadow,
            ), trial


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("measured", [False, True])
@pytest.mark.parametrize("after_prompt", [True, False])
def test_both_plans_decide_as_each_request_would(target, sps, lazy, measured, after_prompt):
    """Without probe values (the default) a small batch is priced request by request
    (``plan_each``), a large one at once (``plan_batch``): forced either way, at every size,
    both make the reference's decisions, lookups and probe clocks."""
    rng = random.Random(11 + lazy + 2 * measured + 4 * after_prompt)
    paths = {"each": 1 << 20, "batch": 0}
    for trial in range(25):
        # at 0.001 most probes wait on their price: the probe cost decides
        config = PayoffConfig(probe_every=4, probe_max=16, probe_budget=rng.choice([0.02, 0.001]))
        drafter = build("dflash", target) if lazy else NoisyOracleDrafter({}, VOCAB)
        costs = None if measured else (("model", rng.uniform(0.0, 0.3)), ("ngram", 0.0))
        payoff = PayoffDrafting(
            drafter, VOCAB, 7, sps, draft_costs=dict(costs) if costs else None, config=config
        )
        payoff.model_after_prompt = after_prompt  # a drafter not asked in a request's first round
        priced(payoff, rng, measured=measured)
        # a batch that drains, whose share drafting lately is low or high (``drain_value``)
        payoff.draining, payoff.paying_share = rng.random() < 0.5, rng.choice([0.0, 0.3, 1.0])
        reqs = requests(rng, rng.choice([1, 2, 4, 8, 16]), config)
        expected_reqs, expected_payoff = copy.deepcopy(reqs), copy.deepcopy(payoff)
        expected_choices, expected_lookups = reference_plan(expected_payoff, expected_reqs, 7)
        for path, small_batch in paths.items():
            got_reqs, got_payoff = copy.deepcopy(reqs), copy.deepcopy(payoff)
            got_payoff.small_batch = small_batch
            choices, lookups = got_payoff.plan(got_reqs, 7)
            assert (got_payoff.planned, choices, lookups) == (1, expected_choices, expected_lookups), (
                path,
                trial,
            )
            assert got_payoff.paying_share == pytest.approx(expected_payoff.paying_share), (path, trial)
            for got, want in zip(got_reqs, expected_reqs):
                state = (got.payoff.skipped, got.payoff.interval, got.shadow, got.payoff.expecting)
                assert state == (
                    want.payoff.skipped, want.payoff.interval, want.shadow, want.payoff.expecting
                ), (path, trial)  # fmt: skip


def test_rounds_chosen_to_draft_teach_realism_and_probes_do_not(target, sps):
    """The plan records what each round it chose to draft was expected to accept (unscaled);
    the outcome then feeds that proposer's :class:`Realism`. Probes, plain rounds and an
    outcome of another proposer leave it alone."""
    payoff = PayoffDrafting(
        NoisyOracleDrafter({}, VOCAB), VOCAB, 7, sps, draft_costs={MODEL: 0.0, NGRAM: 0.0}
    )
    payoff.clock = lambda: 0.0
    rng = random.Random(3)
    reqs = requests(rng, 16)
    choices, _ = payoff.plan(reqs, 7)
    drafted = [(r, c) for r, c in zip(reqs, choices) if c.proposer is not None and not c.probe]
    others = [r for r, c in zip(reqs, choices) if c.proposer is None or c.probe]
    assert drafted and others
    for req, choice in drafted:
        name, e, q = req.payoff.expecting
        assert name == choice.proposer
        assert (e, q) == pytest.approx(req.payoff.record(name).rates(payoff.config, None))
    assert all(r.payoff.expecting is None for r in others)
    req, choice = drafted[0]
    _, e, q = req.payoff.expecting
    payoff.observe(req, 3, 1, choice.proposer)
    realism = payoff.realism[choice.proposer]
    assert (realism.expected, realism.accepted) == pytest.approx((e + e * q + e * q * q, 1.0))
    assert req.payoff.expecting is None  # counted once
    payoff.observe(req, 3, 1, choice.proposer)
    assert realism.accepted == pytest.approx(1.0 * payoff.config.realism_memory**0)  # unchanged
    # the realised ratio then scales the next plan's first-draft rates
    assert payoff.scales()[choice.proposer] == pytest.approx((1.0 + 8.0) / (realism.expected + 8.0))
