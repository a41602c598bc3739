"""Costs the requests of a round share, and whether their gains together repay them (issue 17).

Per-request payoff control (``scheduler/payoff.py``) prices what drafting costs each request
on its own. Three costs are shared, and each is repaid only by the requests that draft
together: a drafter call's per-call seconds (:func:`shared_call_pays`), the fixed part of a
step in which anybody verifies (:func:`verification_pays`), and, while a batch drains, the
fixed part of every step, which an accepted draft saves only if the batch drafts together
(:func:`drain_value`). History only, so decisions priced with these stay lossless.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dspark.scheduler.payoff import RoundCosts


def shared_call_pays(gains: Sequence[float], call_s: float, tokens_per_s: float) -> bool:
    """Does one drafter call repay its per-call seconds ``call_s`` (shared by the requests
    drafting with it) from ``gains``, those requests' net gains in tokens priced with the
    per-request seconds only? Each drafting request adds its own gain; the call costs
    ``ρ · call_s`` tokens once."""
    return sum(g for g in gains if g > 0) > tokens_per_s * call_s


def verification_pays(
    gains: Mapping[str, Sequence[float]], costs: RoundCosts, call_s: Mapping[str, float] | None = None
) -> bool:
    """Does a step in which these requests draft repay the seconds it pays once because some
    request verifies (``costs.verify_call_s``)? ``gains``: per proposer the batch may draft
    with, each request's net gain in tokens (``-inf`` where it cannot propose); each request
    drafts with its best proposer where that gain is positive, and a proposer in ``call_s``
    charges its per-call seconds once if any request picks it. As :func:`shared_call_pays`,
    one more shared cost: ``Σ_r max_p G_r(p)⁺ − ρ·Σ_{p used} c_p > ρ·j``."""
    j, rho = costs.verify_call_s, costs.tokens_per_s
    if j <= 0:
        return True
    names = list(gains)
    total, used = 0.0, set()
    for row in zip(*(gains[n] for n in names)):
        k = max(range(len(names)), key=row.__getitem__)
        if row[k] > 0:
            total += row[k]
            used.add(names[k])
    total -= rho * sum((call_s or {}).get(n, 0.0) for n in used)
    return total > rho * j


def drain_value(a: float, b: float, num_requests: int, share: float) -> float:
    """What an accepted draft is worth in a batch that drains, as a fraction of ``1/ρ``.

    A step of ``B`` tokens takes ``t̂(B) = a + b·B``; plain decoding prices a token at
    ``1/ρ = (a + b·R)/R``, what it is worth while the batch stays full. In a drain the batch
    takes as long as its last request: a draft accepted by one request saves its own row of
    a step (``b``), and the fixed part ``a`` only when every request gains together. With a
    ``share`` of the batch drafting, one accepted draft is valued ``b + share·a/R``:

        w = (b·R + share·a) / (a + b·R)

    1 at ``share = 1`` (the whole batch drafts: ``1/ρ``), ``b·R/(a + b·R)`` at 0. On the tiny
    target at 16 requests a drain saved 1.38 ms of plain steps per accepted n-gram draft, priced
    at 1/ρ = 4.16 ms (``scripts/bench_drain.py``; BENCHMARKS.md). One request is the whole batch."""
    total = a + b * num_requests
    if num_requests <= 1 or total <= 0:
        return 1.0
    return (b * num_requests + min(max(share, 0.0), 1.0) * a) / total
