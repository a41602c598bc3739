"""When training has stopped paying: expected τ flat over the last part of a run.

A pure function of the logged history, so the stop rule gives the same answer when a
killed run is resumed and replays its ``metrics.jsonl``.
"""

from __future__ import annotations

from collections.abc import Sequence


def plateaued(
    steps: Sequence[int],
    values: Sequence[float],
    *,
    tail: float = 0.2,
    min_gain: float = 0.01,
    window: int = 5,
    min_step: int = 0,
) -> bool:
    """True when ``values`` rose by less than ``min_gain`` (relative) over the last ``tail`` of the steps.

    ``values[i]`` was logged at ``steps[i]`` (ascending). The value at a step is the mean
    of the ``window`` records ending there (expected τ of one log interval is noisy); the
    comparison is between the newest step ``s`` and the newest step at or before
    ``(1 - tail) · s``. Never true before ``min_step`` or without a full window at both ends.
    """
    assert len(steps) == len(values), f"{len(steps)} steps vs {len(values)} values"
    if not steps or steps[-1] < min_step or len(steps) < 2 * window:
        return False
    horizon = (1.0 - tail) * steps[-1]
    earlier = [i for i, s in enumerate(steps) if s <= horizon]
    if not earlier or earlier[-1] + 1 < window:
        return False
    i = earlier[-1]

    def smoothed(end: int) -> float:
        chunk = values[end + 1 - window : end + 1]
        return sum(chunk) / len(chunk)

    before, now = smoothed(i), smoothed(len(values) - 1)
    return now < before * (1.0 + min_gain)
