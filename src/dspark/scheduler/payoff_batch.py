"""Payoff gains of a whole batch at once: the per-request formulas of ``scheduler/payoff.py``, vectorised.

At 16 or 64 running requests the controller prices every request with every proposer each
round, and most rounds end with every request decoding plainly. Done request by request in
Python that pricing cost about 2 % of a plain step on the tiny target (issue 17's floor).
Here the rates (:meth:`AcceptanceRecord.rates`) and best lengths (:func:`best_length`)
of R requests are arrays:

    e_r = (a_r + s·e0) / (n_r + s),   q_r likewise,
    G_r = max_{1 ≤ ℓ ≤ cap_r} [ Σ_{k<ℓ} e_r q_r^k / margin − ρ·v(ℓ) ] − ρ·d_r

with the same prior strengths and the same first-maximum tie rule as the scalar code, so
a batch's gains equal the per-request ones (tested); :func:`batch_probe_cost` prices a
probe of each request (:func:`~dspark.scheduler.payoff.probe_cost`); :func:`quiet_rows`
then finds the requests whose round is already decided — nothing usable pays and no
probe is due — so that only the others go through :meth:`PayoffController.decide`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dspark.scheduler.payoff import (
    AcceptanceRecord,
    Choice,
    PayoffConfig,
    PayoffController,
    RoundCosts,
    probe_wait,
)
from dspark.scheduler.shared_costs import shared_call_pays

_EMPTY = AcceptanceRecord()
QUIET_FOREVER = 1 << 30  # quiet_margin of a row no probe can fall due for


def batch_rates(
    records: Sequence[AcceptanceRecord | None],
    config: PayoffConfig,
    prior: tuple[float, float] | None,
    *,
    after_probe: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(e [R], q [R])`` of :meth:`AcceptanceRecord.rates` for each record (None: no evidence yet);
    ``after_probe``: of :meth:`AcceptanceRecord.after_probe` with that outcome instead."""
    fields = np.array(
        [
            (r.first_accepted, r.first_tested, r.later_accepted, r.later_tested, r.rounds)
            for r in (rec or _EMPTY for rec in records)
        ],
        dtype=np.float64,
    ).reshape(-1, 5)  # [R, 5]
    fa, ft, la, lt, rounds = fields.T
    if after_probe is not None:  # one more first draft verified, the past decayed once
        fa, ft, rounds = config.memory * fa + float(after_probe), config.memory * ft + 1.0, rounds + 1
    if prior is not None:
        s = np.full_like(fa, config.pool_strength)
        e0, q0 = prior
    else:  # the config's guess fades like observed rounds (see AcceptanceRecord.rates)
        s = config.prior_strength * config.memory**rounds
        e0, q0 = config.prior_first, config.prior_later
    return (fa + s * e0) / (ft + s), (la + s * q0) / (lt + s)


def batch_net(e: np.ndarray, q: np.ndarray, costs: RoundCosts, margin: float = 1.0) -> np.ndarray:
    """``[R, K]``: net gain in tokens of verifying ``ℓ = k + 1`` drafts, before drafting costs."""
    k = np.arange(len(costs.verify_s) - 1)  # [K]
    # Σ_{j≤k} e q^j / margin, summed left to right like the scalar loop
    accepted = np.cumsum(e[:, None] * q[:, None] ** k / margin, axis=1)  # [R, K]
    return accepted - costs.tokens_per_s * np.asarray(costs.verify_s[1:], dtype=np.float64)


def best_of(
    net: np.ndarray, caps: np.ndarray, draft_s: np.ndarray | float, tokens_per_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """``(G [R], ℓ [R])``: the best of :func:`batch_net`'s row up to ``cap``, less ``ρ·d``;
    ``(-inf, 0)`` where ``cap < 1``."""
    R, K = net.shape
    caps = np.minimum(np.asarray(caps, dtype=np.int64), K)  # [R]
    gain = np.full(R, -np.inf)
    ell = np.zeros(R, dtype=np.int64)
    live = caps >= 1
    if K < 1 or not live.any():
        return gain, ell
    net = np.where(np.arange(K)[None, :] < caps[:, None], net, -np.inf)  # [R, K]
    best = net.argmax(axis=1)  # [R] first maximum, as the scalar loop's strict ">"
    draft_s = np.broadcast_to(np.asarray(draft_s, dtype=np.float64), (R,))  # [R]
    top = net[np.arange(R), best] - tokens_per_s * draft_s
    gain[live], ell[live] = top[live], best[live] + 1
    return gain, ell


def batch_best_length(
    e: np.ndarray,
    q: np.ndarray,
    caps: np.ndarray,
    draft_s: np.ndarray | float,
    costs: RoundCosts,
    margin: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """``(G [R], ℓ [R])`` of :func:`~dspark.scheduler.payoff.best_length` per row; ``(-inf, 0)``
    where ``cap < 1``."""
    return best_of(batch_net(e, q, costs, margin), caps, draft_s, costs.tokens_per_s)


def batch_probe_cost(
    net: np.ndarray,
    length: int,
    *,
    draft_s: np.ndarray | float,
    call_s: float,
    costs: RoundCosts,
    margin: float = 1.0,
    step_s: float = 0.0,
) -> np.ndarray:
    """``[R]``: :func:`~dspark.scheduler.payoff.probe_cost` of each row of :func:`batch_net`'s ``net``."""
    R, K = net.shape
    rho = costs.tokens_per_s
    overhead = rho * (np.broadcast_to(np.asarray(draft_s, dtype=np.float64), (R,)) + call_s)  # [R]
    perfect = max((ell / margin - rho * costs.verify_s[ell] for ell in range(1, K + 1)), default=0.0)
    length = min(length, K)
    if length < 1:
        return np.full(R, np.inf)
    cost = np.maximum(0.0, rho * step_s - (net[:, length - 1] - overhead))
    return np.where(perfect - overhead <= 0, np.inf, cost)


def batch_probe_value(
    records: Sequence[AcceptanceRecord | None],
    e: np.ndarray,
    caps: np.ndarray,
    horizon: np.ndarray,
    *,
    draft_s: np.ndarray | float,
    costs: RoundCosts,
    config: PayoffConfig,
    prior: tuple[float, float] | None,
    scale: float = 1.0,
) -> np.ndarray:
    """``[R]``: :func:`~dspark.scheduler.payoff.probe_value` of a probe of each record, whose
    first-draft rate is ``e`` now, for ``horizon`` rounds left and ``caps`` drafts at most;
    first-draft rates priced times ``scale`` (:class:`~dspark.scheduler.payoff.Realism`)."""
    gain = {}
    for outcome in (True, False):
        e_after, q_after = batch_rates(records, config, prior, after_probe=outcome)
        net = batch_net(np.minimum(e_after * scale, 1.0), q_after, costs, config.margin)
        gain[outcome] = np.maximum(best_of(net, caps, draft_s, costs.tokens_per_s)[0], 0.0)  # [R]
    return horizon * (e * gain[True] + (1.0 - e) * gain[False])


def pooled_probe_value(
    pool: AcceptanceRecord,
    records: Sequence[AcceptanceRecord | None],
    caps: np.ndarray,
    horizon: np.ndarray,
    *,
    draft_s: np.ndarray | float,
    costs: RoundCosts,
    config: PayoffConfig,
    pool_memory: float,
    scale: float = 1.0,
) -> float:
    """Tokens one probe is expected to win for the whole batch by what it tells the pooled rates
    (first-draft rates priced times ``scale``, as :func:`batch_probe_value`).

    Every request's rates shrink to the pool, so a probe's outcome moves them all, most
    while the pool holds little evidence: with the pool after a hit (probability the
    pool's ``e``) or a miss, row r's best gain becomes ``G'_r``, and the probe is worth

        V = Σ_r H_r · max(0, E[max(G'_r, 0)] − max(G_r, 0))

    (:func:`~dspark.scheduler.payoff.probe_value` is the same for the prober's own record).
    """
    now = pool.rates(config)
    e_pool = now[0]

    def gains(prior: tuple[float, float]) -> np.ndarray:
        e, q = batch_rates(records, config, prior)
        net = batch_net(np.minimum(e * scale, 1.0), q, costs, config.margin)
        return np.maximum(best_of(net, caps, draft_s, costs.tokens_per_s)[0], 0.0)

    expected = sum(
        weight * gains(pool.after_probe(hit, pool_memory).rates(config))
        for hit, weight in ((True, e_pool), (False, 1.0 - e_pool))
    )  # [R]
    return float(np.sum(horizon * np.maximum(expected - gains(now), 0.0)))


def quiet_margin(
    gains: dict[str, np.ndarray],
    *,
    probeable: Sequence[str],
    blocked: Sequence[str],
    skipped: np.ndarray,
    interval: np.ndarray,
    probe_costs: dict[str, np.ndarray] | None = None,
    probe_values: dict[str, np.ndarray] | None = None,
    config: PayoffConfig | None = None,
) -> np.ndarray:
    """``[R]`` int: ``-1`` for a row that may draft or probe this round; for a quiet row — one
    whose :meth:`PayoffController.decide` is known to return plain decoding and only count a
    skipped round — how many further rounds it stays quiet while these gains and probe waits
    hold (``QUIET_FOREVER`` when no probeable proposer can propose).

    A row is quiet when no usable proposer has a positive gain and no probe is due: a probe
    falls due once ``skipped + 1 >= max(interval, probe wait)``, so a quiet row has
    ``ceil(wait - skipped - 1) - 1`` rounds left (``wait - skipped - 2`` for a whole wait).
    ``probe_costs``: :func:`batch_probe_cost` per proposer (missing: 0); ``probe_values``:
    :func:`batch_probe_value` per proposer (missing: the cost alone)."""
    R = skipped.shape[0]
    usable = [g for name, g in gains.items() if name not in blocked]
    pays = np.zeros(R, dtype=bool)
    for g in usable:
        pays |= g > 0
    margin = np.full(R, QUIET_FOREVER, dtype=np.int64)
    config = config or PayoffConfig()
    for name in probeable:
        if name in gains:
            cost = (probe_costs or {}).get(name)
            wait = interval if cost is None else np.maximum(interval, probe_wait(cost, config))
            value = (probe_values or {}).get(name)
            if cost is not None and value is not None and config.value_probes:
                wait = np.where(value >= cost, interval, wait)  # probe_due_after, per row
            # due once skipped + 1 >= wait: the next rounds j = 1, 2, ... stay quiet while
            # skipped + j + 1 < wait (a wait may be fractional, or inf: never)
            left = np.minimum(np.ceil(np.asarray(wait, dtype=np.float64) - skipped - 1) - 1, QUIET_FOREVER)
            margin = np.where(np.isfinite(gains[name]), np.minimum(margin, left.astype(np.int64)), margin)
    return np.where(pays, -1, np.maximum(margin, -1))


def shared_call_repaid(gains: dict[str, np.ndarray], name: str, call_s: float, tokens_per_s: float) -> bool:
    """:func:`~dspark.scheduler.shared_costs.shared_call_pays` over the rows that would draft with
    ``name`` (it can propose and no other proposer gains more for the row)."""
    top = np.maximum.reduce(list(gains.values()))  # [R]
    g = gains[name]
    return shared_call_pays(g[np.isfinite(g) & (g >= top)].tolist(), call_s, tokens_per_s)


def join_probe_call(
    choices: list[Choice],
    ctrls: list[PayoffController],
    gains: Mapping[str, tuple[np.ndarray, np.ndarray]],
    model: str,
) -> None:
    """When the ``model`` proposer's shared call is blocked (the batch does not repay it) but
    some request probes it this round, the call is paid anyway: every request whose own gain
    with it is positive and beats its current choice drafts with it for real (in place)."""
    if not any(c.probe and c.proposer == model for c in choices):
        return
    g_model, ell_model = gains[model]
    for i, choice in enumerate(choices):
        if choice.proposer == model:
            continue
        rival = max([0.0] + [float(g[i]) for name, (g, _) in gains.items() if name != model])
        if g_model[i] > rival:
            choices[i] = ctrls[i].drafts(model, int(ell_model[i]))


def join_verifying_step(
    choices: list[Choice],
    ctrls: list[PayoffController],
    gains: Mapping[str, tuple[Sequence[float], Sequence[int]]],
    blocked: Sequence[str],
) -> None:
    """When the batch does not repay the fixed part of a step in which anybody verifies
    (:func:`~dspark.scheduler.shared_costs.verification_pays`) but some request verifies this round
    anyway (a probe), the step pays it: every request left plain whose own gain with a proposer
    it may use is positive drafts with the best of them (in place). ``blocked``: proposers whose
    shared call the batch does not repay, usable only where some request calls them anyway."""
    calling = {c.proposer for c in choices if c.proposer is not None}
    usable = [name for name in gains if name not in blocked or name in calling]
    if not (calling and usable):
        return
    for i, choice in enumerate(choices):
        if choice.proposer is not None:
            continue
        name = max(usable, key=lambda n: float(gains[n][0][i]))
        if float(gains[name][0][i]) > 0:
            choices[i] = ctrls[i].drafts(name, int(gains[name][1][i]))


def keep_q_observable(choices: list[Choice], caps: np.ndarray | None, model: str) -> None:
    """A round drafting with ``model`` verifies at least 2 drafts where it can (in place).

    Only a round verifying ``ℓ >= 2`` tests a later draft, so once the rates priced ``ℓ = 1``
    the later rate ``q`` never moved again: a few early misses at position 2 held a drafter
    to one draft a round for the rest of the run (mt-bench, batch 1, tiny target: τ 1.98
    against 3.03 with every round at γ). A model drafts its whole block whatever ``ℓ`` is,
    so the second draft costs one more verified token. Probes keep their length; ``caps``
    None: no model drafter."""
    for i, choice in enumerate([] if caps is None else choices):
        if choice.proposer == model and not choice.probe and choice.length < min(2, int(caps[i])):
            choices[i] = Choice(model, min(2, int(caps[i])))
