"""How many more training steps a quickstart drafter would need to reach a shipped one.

An estimate read off the shipped drafter's learning curve (``SHIPPED.json``, the
campaign's validation expected τ against steps): find where that curve first reaches
the quickstart drafter's expected τ and where it first reaches the shipped drafter's;
the steps between are what the shipped run took to go from one to the other. It is
another run's curve (its data, batch and learning-rate schedule), so it says how far
apart the two drafters are in training, not what this run's own schedule would do.

Both values are measured by the quickstart on one set (its validation set). The curve
was measured on the campaign's own fixed samples, which may be easier or harder: it is
mapped onto the quickstart's set by scaling τ − 1 (the expected number of accepted
drafts) so that its last point — the shipped weights — equals the shipped drafter's
expected τ measured here (:func:`scaled`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ALREADY = "already there"  # the quickstart drafter is at or above the shipped one
ESTIMATE = "estimate"  # both values lie on the curve
AT_LEAST = "at least"  # the curve starts above the quickstart's value: a lower bound
BEYOND_END = "beyond the curve's end"  # the curve never reaches the goal: no estimate
BEFORE_START = "before the curve's start"  # both values lie below the curve's first point


@dataclass(frozen=True, kw_only=True)
class Reach:
    """Where a value and a goal sit on a learning curve, and the steps between them."""

    kind: str  # one of the five above
    own_step: float | None  # the curve's first step at the quickstart's value (an upper bound for AT_LEAST)
    goal_step: float | None  # the curve's first step at the goal
    more_steps: float | None  # goal_step − own_step (0 when ALREADY; a lower bound for AT_LEAST)
    more_tokens: float | None  # more_steps × the curve run's tokens per step


def first_reach(steps: Sequence[float], values: Sequence[float], level: float) -> float | None:
    """The first step at which the curve reaches ``level``, linearly interpolated between
    logged points; ``steps[0]`` when the first point already does; None when no point does."""
    assert len(steps) == len(values) and steps, "a curve needs points"
    if values[0] >= level:
        return float(steps[0])
    for (s0, v0), (s1, v1) in zip(zip(steps, values), zip(steps[1:], values[1:])):
        if v1 >= level:  # v0 < level ≤ v1
            return s0 + (s1 - s0) * (level - v0) / (v1 - v0)
    return None


def scaled(values: Sequence[float], last: float) -> list[float]:
    """``values`` with τ − 1 scaled so that the last one becomes ``last``."""
    if values[-1] <= 1.0:  # a curve that never left τ = 1 has nothing to scale
        return list(values)
    factor = (last - 1.0) / (values[-1] - 1.0)
    return [1.0 + factor * (v - 1.0) for v in values]


def steps_to_reach(
    steps: Sequence[float], values: Sequence[float], own: float, goal: float, *, tokens_per_step: float
) -> Reach:
    """How many more of the curve run's steps lead from ``own`` to ``goal`` (see module doc)."""
    if own >= goal:
        return Reach(kind=ALREADY, own_step=None, goal_step=None, more_steps=0.0, more_tokens=0.0)
    goal_step = first_reach(steps, values, goal)
    if goal_step is None:
        return Reach(kind=BEYOND_END, own_step=None, goal_step=None, more_steps=None, more_tokens=None)
    if values[0] >= goal:
        return Reach(kind=BEFORE_START, own_step=None, goal_step=goal_step, more_steps=None, more_tokens=None)
    own_step = first_reach(steps, values, own)
    assert own_step is not None  # own < goal, which the curve reaches
    kind = AT_LEAST if values[0] >= own else ESTIMATE
    more = goal_step - own_step
    return Reach(
        kind=kind, own_step=own_step, goal_step=goal_step, more_steps=more, more_tokens=more * tokens_per_step
    )
