"""A round's payoff plan: every decoding request's proposer and verification cap (issue 17).

The decisions are :meth:`PayoffController.decide`'s, request by request, fed with the
round's costs, the pooled priors and :class:`~dspark.scheduler.payoff.Realism` scales of
:class:`~dspark.engine.payoff_drafting.PayoffDrafting`. Two ways to reach them, tested to
agree choice for choice:

- :func:`plan_batch` prices every request with every proposer at once with the numpy
  formulas of ``scheduler/payoff_batch.py`` and sends through ``decide`` only the requests
  that may draft or probe; it also lets a batch that decodes plainly reuse its plan
  (``QUIET_REPLAN``). Above ``SMALL_BATCH`` requests that is the cheaper way.
- :func:`plan_each` prices request by request with the scalar formulas of
  ``scheduler/payoff.py``. Up to ``SMALL_BATCH`` requests the batch formulas' numpy calls
  cost more than the arithmetic they vectorise: 0.8 ms of a 23 ms step at 4 requests on
  the tiny target (``scripts/bench_floor.py``), a floor of 3.5 % under plain decoding.

Both price with the round's config (:meth:`PayoffDrafting.round_config`: while the batch
drains, an accepted draft is valued by ``shared_costs.drain_value``, as a raised margin) and
record the share of requests whose drafts would pay at ``1/ρ``, which sets that value for
the next rounds. Both judge the round's shared costs on the same gains
(``scheduler/shared_costs.py``): the model's call, and the fixed part of a step in which
anybody verifies, which gates the whole round. Both end in :func:`settle`: a blocked model
call or a gated step that a probe pays anyway is joined, model rounds verify two drafts at
least and as far as the upper bound of the request's later acceptance pays
(:func:`explore_lengths`), each real round records what it expects (Realism), and the
n-gram's shadow evaluations start.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from dspark.scheduler.payoff import (
    PLAIN,
    AcceptanceRecord,
    Choice,
    PayoffConfig,
    PayoffController,
    RoundCosts,
    best_length,
    explored_length,
    probe_cost,
    start_shadows,
)
from dspark.scheduler.payoff_batch import (
    batch_net,
    batch_probe_cost,
    batch_probe_value,
    batch_rates,
    best_of,
    join_probe_call,
    join_verifying_step,
    keep_q_observable,
    pooled_probe_value,
    quiet_margin,
    shared_call_repaid,
)
from dspark.scheduler.shared_costs import shared_call_pays, verification_pays

if TYPE_CHECKING:
    from dspark.engine.payoff_drafting import PayoffDrafting

NGRAM, MODEL = "ngram", "model"
POOL_MEMORY = 0.99  # per pooled observation
# While a plan leaves every request plain and no probe can fall due, the next rounds reuse it
# (counting skipped rounds, with the n-gram lookups due) for up to this many rounds in all:
# pricing the batch is most of what a drafter attached costs a batch that decodes plainly
# (gsm8k, 16 requests, tiny target: 0.8 ms of a 35 ms step).
QUIET_REPLAN = 4
# Batches up to this many requests are priced request by request (:func:`plan_each`). Thread
# CPU ms per plan, DSpark on the tiny target, humaneval, per request / batch, two runs:
# 0.21 / 0.75 and 0.22 / 0.77 at 1 request, 0.28 / 0.80 and 0.30 / 0.87 at 4, 0.55 / 0.93 and
# 0.63 / 0.92 at 16, 0.95 / 1.07 and 2.49 / 1.26 at 32, 1.31 / 1.07 and 1.91 / 1.50 at 64
# (``python scripts/plan_cost.py dspark $B/humaneval.jsonl 1,4,16,32,64``).
SMALL_BATCH = 16

_EMPTY = AcceptanceRecord()  # rates of a request without evidence (never mutated)
Gains = dict[str, tuple[Sequence[float], Sequence[int]]]  # proposer -> (G [R], ℓ [R])


def plan_each(payoff: PayoffDrafting, decoding: list, K: int) -> tuple[list[Choice], dict[int, list[int]]]:
    """The round's choices and n-gram lookups (request id -> tokens), priced request by request.

    Not with ``value_probes`` (:func:`plan_batch` prices a probe's value)."""
    assert not payoff.config.value_probes, "plan_each does not price a probe's value"
    R = len(decoding)
    costs = payoff.costs(R)
    config = payoff.round_config(costs, R)
    priors = payoff.priors()
    scales = payoff.scales()
    ctrls = [r.payoff for r in decoding]
    budget = [min(K, max(r.draft_budget, 0)) for r in decoding]
    rates = {  # proposer -> (e, q) per request, unscaled
        name: [(c.records.get(name) or _EMPTY).rates(config, priors.get(name)) for c in ctrls]
        for name in payoff.proposers
    }

    def best(
        name: str, i: int, cap: int, draft_s: float, rate=None, margin=config.margin
    ) -> tuple[float, int]:
        e, q = rate or rates[name][i]  # (e, q) unscaled: the request's own, by default
        e = min(1.0, e * scales.get(name, 1.0))
        return best_length(e, q, cap, draft_s=draft_s, costs=costs, margin=margin)

    lookups: dict[int, list[int]] = {}
    caps: dict[str, list[int]] = {}
    d_ngram = costs.draft_s.get(NGRAM, 0.0)
    hopeless: list[bool] = []  # per request: the n-gram could not pay even with a whole block
    if payoff.ngram is not None:
        hopeless = [best(NGRAM, i, n, d_ngram)[0] <= 0 for i, n in enumerate(budget)]
        lookups = payoff._lookups(decoding, budget, hopeless)
        caps[NGRAM] = [len(lookups[r.id]) for r in decoding]
    model_s = [costs.draft_s.get(MODEL, 0.0)] * R
    if payoff.model is not None:
        if MODEL in costs.draft_s and payoff.sync_line.w:  # + each request's catch-up
            model_s = [d + c for d, c in zip(model_s, payoff.catch_up_charge(decoding))]
        after_prompt = payoff.model_after_prompt
        caps[MODEL] = [n if after_prompt or r.generated else 0 for r, n in zip(decoding, budget)]
    draft_s = {NGRAM: [d_ngram] * R, MODEL: model_s}
    own = [
        {name: best(name, i, c[i], draft_s[name][i]) for name, c in caps.items() if c[i] >= 1}
        for i in range(R)
    ]
    at_rho = own  # the gains at 1/ρ's value: the share whose drafts would pay there (drain_value)
    if config is not payoff.config:
        m = payoff.config.margin
        at_rho = [
            {name: best(name, i, c[i], draft_s[name][i], margin=m) for name, c in caps.items() if c[i] >= 1}
            for i in range(R)
        ]
    if R:
        payoff.observe_share(sum(max((g for g, _ in o.values()), default=0.0) > 0 for o in at_rho) / R)
    tried = MODEL in payoff.pooled
    call_s = payoff.model_call_s(R) if tried else 0.0
    blocked: tuple[str, ...] = ()
    # the gains the shared costs are judged on: the model's at the pool's upper bound (upper_rates)
    shared = {name: [g.get(name, (-math.inf, 0))[0] for g in own] for name in caps}
    if call_s > 0 and payoff.model is not None:  # the model's call is shared: does the batch repay it?
        bound, top = payoff.bound(MODEL), []
        for i, g in enumerate(own):
            if MODEL in g:
                rate = (ctrls[i].records.get(MODEL) or _EMPTY).rates(config, bound)
                shared[MODEL][i] = b = best(MODEL, i, caps[MODEL][i], model_s[i], rate)[0]
                if b >= max((v[0] for name, v in g.items() if name != MODEL), default=-math.inf):
                    top.append(b)
        blocked = () if shared_call_pays(top, call_s, costs.tokens_per_s) else (MODEL,)
    # ... and the step's fixed part of verification: if the batch does not repay it, nobody drafts
    # (but probes, which the others then join: settle)
    usable = {name: g for name, g in shared.items() if name not in blocked}
    gated = not verification_pays(usable, costs, {MODEL: call_s})
    probe_step_s = costs.verify_call_s if gated else 0.0  # a lone probe pays it
    choices, model_tries = [], False
    skipped = [c.skipped for c in ctrls]  # before this round's decisions count it
    model_probes = []  # probe_cost with the model per request
    for i, ctrl in enumerate(ctrls):
        own_caps = {name: c[i] for name, c in caps.items()}
        gains = own[i]
        probes = {}
        if payoff.model is not None:
            e, q = rates[MODEL][i]
            probes[MODEL] = probe_cost(
                min(1.0, e * scales.get(MODEL, 1.0)), q, config.probe_length, draft_s=model_s[i],
                call_s=call_s, costs=costs, margin=config.margin, step_s=probe_step_s,
            )  # fmt: skip
            model_probes.append(probes[MODEL])
            if not tried and model_tries:  # one request at a time tries the model (see plan_batch)
                own_caps[MODEL] = 0
                gains = {n: g for n, g in gains.items() if n != MODEL}
        choice = ctrl.decide(
            own_caps, costs, shadowed=(NGRAM,), priors=priors, blocked=tuple(caps) if gated else blocked,
            gains=gains, probe_costs=probes,
        )  # fmt: skip
        choices.append(choice)
        model_tries |= choice.proposer == MODEL
    table: Gains = {  # as plan_batch's arrays: -inf where a proposer cannot propose
        name: ([g.get(name, (-math.inf, 0))[0] for g in own], [g.get(name, (-math.inf, 0))[1] for g in own])
        for name in caps
    }
    unscaled = {name: ([e for e, _ in r], [q for _, q in r]) for name, r in rates.items()}
    first = MODEL in caps and not payoff.model_after_prompt and not all(r.generated for r in decoding)
    if R and not first and not gated and all(c.proposer is None for c in choices) and all(hopeless):
        # as plan_batch: every request decodes plainly and the n-gram could not pay even with
        # a whole block, so the next rounds may keep this plan while no probe falls due
        margin = quiet_margin(
            {name: np.asarray(g) for name, (g, _) in table.items()},
            probeable=[n for n in table if n != NGRAM],
            blocked=blocked,
            skipped=np.asarray(skipped, dtype=np.int64),
            interval=np.array([c.interval or c.config.probe_every for c in ctrls], dtype=np.int64),
            probe_costs={MODEL: np.asarray(model_probes)} if model_probes else None,
            config=config,
        )  # fmt: skip
        hold_quiet(payoff, decoding, K, margin)
    settle(
        payoff, decoding, choices, table, caps.get(MODEL), unscaled, lookups, blocked, costs, config, gated
    )
    return choices, lookups


def hold_quiet(payoff: PayoffDrafting, decoding: list, K: int, margin: np.ndarray) -> None:
    """Let the next rounds reuse this plan (:meth:`PayoffDrafting._quiet_round`) for as long as
    every request stays quiet (``margin`` ``[R]``: :func:`quiet_margin`), at most ``QUIET_REPLAN``
    rounds in all. For a plan in which every request decodes plainly and the n-gram could not
    pay even with a whole block (so only due lookups run)."""
    rounds = min(QUIET_REPLAN - 1, int(margin.min())) if len(decoding) else 0
    if rounds > 0:
        payoff._quiet = (tuple(r.id for r in decoding), K, rounds)


def plan_batch(payoff: PayoffDrafting, decoding: list, K: int) -> tuple[list[Choice], dict[int, list[int]]]:
    """The round's choices and n-gram lookups, every request's gains computed at once; only the
    requests that may draft or probe this round go through ``decide``, the others just count
    a plain round."""
    R = len(decoding)
    # requests in their first round, where a drafter trained on response anchors is not asked
    first = [] if payoff.model_after_prompt else [not r.generated for r in decoding]
    costs = payoff.costs(R)
    config = payoff.round_config(costs, R)
    priors = payoff.priors()
    scales = payoff.scales()
    ctrls = [r.payoff for r in decoding]
    budget = np.array([min(K, max(r.draft_budget, 0)) for r in decoding], dtype=np.int64)  # [R]

    nets: dict[str, np.ndarray] = {}  # proposer -> net gains [R, K] (``batch_net``)
    rates: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # proposer -> (e [R], q [R]) unscaled

    def net_of(name: str, prior) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
        e, q = batch_rates([c.records.get(name) for c in ctrls], config, prior)
        return (e, q), batch_net(np.minimum(e * scales.get(name, 1.0), 1.0), q, costs, config.margin)

    def gains_of(name: str, caps: np.ndarray, draft_s) -> tuple[np.ndarray, np.ndarray]:
        if name not in nets:
            rates[name], nets[name] = net_of(name, priors.get(name))
        return best_of(nets[name], caps, draft_s, costs.tokens_per_s)

    lookups: dict[int, list[int]] = {}
    gains: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # proposer -> (G [R], ℓ [R])
    caps: dict[str, np.ndarray] = {}
    ngram_hopeless = True  # for every request (or no n-gram)
    if payoff.ngram is not None:
        hopeless = gains_of(NGRAM, budget, costs.draft_s.get(NGRAM, 0.0))[0] <= 0  # [R]
        ngram_hopeless = bool(hopeless.all())
        lookups = payoff._lookups(decoding, budget.tolist(), hopeless.tolist())
        caps[NGRAM] = np.array([len(lookups[r.id]) for r in decoding], dtype=np.int64)
        gains[NGRAM] = gains_of(NGRAM, caps[NGRAM], costs.draft_s.get(NGRAM, 0.0))
    tried = MODEL in payoff.pooled
    call_s = payoff.model_call_s(R) if tried else 0.0
    skipped = np.array([c.skipped for c in ctrls], dtype=np.int64)  # [R]
    interval = np.array([c.interval or c.config.probe_every for c in ctrls], dtype=np.int64)  # [R]
    probe_costs: dict[str, np.ndarray] = {}  # proposer -> tokens a probe costs [R]
    probe_values: dict[str, np.ndarray] = {}  # proposer -> tokens it may win by what it tells [R]
    if payoff.model is not None:
        model_s: np.ndarray | float = costs.draft_s.get(MODEL, 0.0)
        if MODEL in costs.draft_s and payoff.sync_line.w:  # + each request's catch-up
            model_s = model_s + np.asarray(payoff.catch_up_charge(decoding))  # [R]
        caps[MODEL] = np.where(first, 0, budget) if first else budget  # [R]
        gains[MODEL] = gains_of(MODEL, caps[MODEL], model_s)
    blocked: tuple[str, ...] = ()
    # the gains the shared costs are judged on: the model's at the pool's upper bound (upper_rates)
    shared = {name: g for name, (g, _) in gains.items()}
    if call_s > 0 and MODEL in gains:  # the model's call is shared: does the batch repay it?
        bound = net_of(MODEL, payoff.bound(MODEL))[1]
        shared[MODEL] = best_of(bound, caps[MODEL], model_s, costs.tokens_per_s)[0]
        blocked = () if shared_call_repaid(shared, MODEL, call_s, costs.tokens_per_s) else (MODEL,)
    # ... and the step's fixed part of verification: if the batch does not repay it, nobody drafts
    # (but probes, which the others then join: settle)
    usable = {name: g.tolist() for name, g in shared.items() if name not in blocked}
    gated = not verification_pays(usable, costs, {MODEL: call_s})
    if payoff.model is not None:
        probe_costs[MODEL] = batch_probe_cost(
            nets[MODEL], config.probe_length, draft_s=model_s, call_s=call_s, costs=costs,
            margin=config.margin, step_s=costs.verify_call_s if gated else 0.0,  # a lone probe pays it
        )  # fmt: skip
        if config.value_probes:
            records = [c.records.get(MODEL) for c in ctrls]
            scale = scales.get(MODEL, 1.0)  # prices the gains; a probe's hit chance is unscaled
            e_now = batch_rates(records, config, priors.get(MODEL))[0]
            left = np.array([max(r.draft_budget + 1, 1) for r in decoding], dtype=np.float64)  # [R]
            probe_values[MODEL] = batch_probe_value(
                records, e_now, budget, left, draft_s=model_s, costs=costs, config=config,
                prior=priors.get(MODEL), scale=scale,
            )  # fmt: skip
            if MODEL in payoff.pooled:  # and what it tells every request through the pool,
                public = pooled_probe_value(
                    payoff.pooled[MODEL], records, budget, left, draft_s=model_s, costs=costs,
                    config=config, pool_memory=POOL_MEMORY, scale=scale,
                )  # fmt: skip
                # carried by one probe a round: the cheapest of those the probe clock allows
                clock_due = (skipped + 1 >= interval) & (gains[MODEL][0] <= 0)
                clock_due &= np.isfinite(probe_costs[MODEL]) & (budget >= 1)
                if clock_due.any():
                    i = int(np.argmin(np.where(clock_due, probe_costs[MODEL], np.inf)))
                    probe_values[MODEL][i] = max(probe_values[MODEL][i], public)
    at_rho = [g for g, _ in gains.values()]  # the gains at 1/ρ's value (drain_value's share)
    if config is not payoff.config:
        draft_s = {NGRAM: costs.draft_s.get(NGRAM, 0.0), MODEL: model_s if payoff.model is not None else 0.0}
        base = payoff.config.margin
        at_rho = [
            best_of(
                batch_net(np.minimum(rates[n][0] * scales.get(n, 1.0), 1.0), rates[n][1], costs, base),
                caps[n], draft_s[n], costs.tokens_per_s,
            )[0]
            for n in gains
        ]  # fmt: skip
    if R:
        payoff.observe_share(float(np.mean(np.max(at_rho, axis=0) > 0)) if at_rho else 0.0)
    margin = quiet_margin(
        {name: g for name, (g, _) in gains.items()},
        probeable=[n for n in gains if n != NGRAM],
        blocked=tuple(gains) if gated else blocked,
        skipped=skipped,
        interval=interval,
        probe_costs=probe_costs,
        probe_values=probe_values,
        config=config,
    )  # [R]
    quiet = margin >= 0
    # (a request in its first round may draft with the model in its next: price that one)
    if ngram_hopeless and not any(first) and not gated:
        hold_quiet(payoff, decoding, K, margin)
    choices = [PLAIN] * R
    for i in np.flatnonzero(quiet).tolist():
        ctrls[i].skipped += 1
    model_tries = False
    for i in np.flatnonzero(~quiet).tolist():
        own_caps = {name: int(c[i]) for name, c in caps.items()}
        own = {n: (float(g[i]), int(ell[i])) for n, (g, ell) in gains.items() if own_caps[n] >= 1}
        if not tried and model_tries:
            # Until some request's outcome with the model is in the pool, one request at a
            # time tries it: its first proposal is the costly one (the whole prompt's context).
            own_caps[MODEL] = 0
            own.pop(MODEL, None)
        own_probes = {name: float(c[i]) for name, c in probe_costs.items()}
        own_values = {name: float(v[i]) for name, v in probe_values.items()}
        choices[i] = ctrls[i].decide(
            own_caps, costs, shadowed=(NGRAM,), priors=priors, blocked=tuple(caps) if gated else blocked,
            gains=own, probe_costs=own_probes, probe_values=own_values,
        )  # fmt: skip
        model_tries |= choices[i].proposer == MODEL
    settle(payoff, decoding, choices, gains, caps.get(MODEL), rates, lookups, blocked, costs, config, gated)
    return choices, lookups


def explore_lengths(
    payoff: PayoffDrafting,
    ctrls: list[PayoffController],
    choices: list[Choice],
    caps: Sequence[int],
    rates: tuple[Sequence[float], Sequence[float]],
    costs: RoundCosts,
    config: PayoffConfig,
) -> None:
    """Model rounds (not probes) verify up to :func:`explored_length` (in place): the block is
    drafted whole anyway, and while a request's later rate rests on few trials its bound
    says a longer prefix may pay, which only verifying it can tell. ``config``: the round's
    (:meth:`~dspark.engine.payoff_drafting.PayoffDrafting.round_config`)."""
    pooled = MODEL in payoff.pooled
    scale = payoff.scales().get(MODEL, 1.0)
    for i, choice in enumerate(choices):
        if choice.proposer != MODEL or choice.probe or choice.length >= caps[i]:
            continue
        record = ctrls[i].records.get(MODEL) or _EMPTY
        trials = record.later_tested + record.strength(config, pooled=pooled)
        e = min(1.0, float(rates[0][i]) * scale)
        ell = explored_length(e, float(rates[1][i]), trials, int(caps[i]), costs=costs, config=config)
        if ell > choice.length:
            choices[i] = Choice(MODEL, ell)


def settle(
    payoff: PayoffDrafting,
    decoding: list,
    choices: list[Choice],
    gains: Mapping[str, tuple[Sequence[float], Sequence[int]]],
    model_caps: Sequence[int] | None,
    rates: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    lookups: dict[int, list[int]],
    blocked: Sequence[str],
    costs: RoundCosts,
    config: PayoffConfig,
    gated: bool = False,
) -> None:
    """What every plan does once each request has decided (in place): ``gains`` per proposer
    ``(G [R], ℓ [R])`` (−inf where it cannot propose), the model's caps ``[R]``, the unscaled
    rates ``(e [R], q [R])`` per proposer; ``blocked``: proposers whose shared call the batch
    does not repay; ``gated``: nor the step's fixed part of verification
    (:func:`~dspark.scheduler.shared_costs.verification_pays`); ``config``: the round's."""
    ctrls: list[PayoffController] = [r.payoff for r in decoding]
    if MODEL in blocked:
        join_probe_call(choices, ctrls, gains, MODEL)
    if gated:
        join_verifying_step(choices, ctrls, gains, blocked)
    keep_q_observable(choices, model_caps, MODEL)
    if config.explore_lengths and model_caps is not None:
        explore_lengths(payoff, ctrls, choices, model_caps, rates[MODEL], costs, config)
    for i, (ctrl, choice) in enumerate(zip(ctrls, choices)):
        ctrl.expecting = None
        if choice.proposer is not None and not choice.probe:
            e, q = rates[choice.proposer]
            ctrl.expecting = (choice.proposer, float(e[i]), float(q[i]))
    start_shadows(decoding, choices, lookups, NGRAM)
