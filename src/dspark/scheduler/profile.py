"""SPS(B): target engine steps per second for a verification forward of B tokens (DESIGN §2, §9).

The prefix scheduler trades expected accepted tokens against the cost of a bigger
verification batch through this curve (paper §3.2.2). It is profiled once per target and
machine (:func:`measure_sps`, driven by ``dspark profile``), saved as a small JSON table,
and looked up in O(1): the table is expanded at construction to one value per B from 1
to the largest measured size, interpolating linearly in step *time* between measured
sizes. Past the largest size the step time is extrapolated linearly in B.

This module knows nothing about models: what a "step of B tokens" is comes in as a
callable.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dspark.durable import write_atomic

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpsTable:
    """Measured ``steps_per_s[i]`` for a forward of ``tokens[i]`` tokens (ascending, from 1)."""

    tokens: tuple[int, ...]
    steps_per_s: tuple[float, ...]
    meta: dict = field(default_factory=dict, compare=False)
    _dense: torch.Tensor = field(init=False, repr=False, compare=False)  # [max_B + 1], index = B
    _values: tuple[float, ...] = field(init=False, repr=False, compare=False)  # _dense as floats

    def __post_init__(self) -> None:
        assert len(self.tokens) == len(self.steps_per_s) > 0, "an SPS table needs at least one point"
        assert list(self.tokens) == sorted(set(self.tokens)) and self.tokens[0] >= 1, self.tokens
        assert all(s > 0 for s in self.steps_per_s), "steps per second must be positive"
        B = torch.tensor(self.tokens, dtype=torch.float64)
        step_s = 1.0 / torch.tensor(self.steps_per_s, dtype=torch.float64)
        grid = torch.arange(0, self.tokens[-1] + 1, dtype=torch.float64)  # [max_B + 1]
        # Piecewise-linear step time between measured sizes (flat below the first).
        idx = torch.searchsorted(B, grid, right=True).clamp(1, len(B) - 1) if len(B) > 1 else None
        if idx is None:
            t = step_s.expand_as(grid)
        else:
            b0, b1, t0, t1 = B[idx - 1], B[idx], step_s[idx - 1], step_s[idx]
            t = torch.where(grid <= B[0], step_s[0], t0 + (t1 - t0) * (grid - b0) / (b1 - b0))
        object.__setattr__(self, "_dense", 1.0 / t)
        # the same values as Python floats: a scalar lookup without a tensor index (~2 µs each,
        # several per payoff plan)
        object.__setattr__(self, "_values", tuple(self._dense.tolist()))

    @property
    def max_tokens(self) -> int:
        return self.tokens[-1]

    def __call__(self, B: int) -> float:
        """SPS(B), O(1)."""
        if self.max_tokens >= B:
            return self._values[max(B, 1)]
        return self._values[-1] * self.max_tokens / B  # step time linear in B past the table

    def lookup(self, B: torch.Tensor) -> torch.Tensor:
        """SPS of every entry of an integer tensor ``B`` (fp64, same shape)."""
        B = B.long().clamp_min(1)
        inside = self._dense[B.clamp_max(self.max_tokens)]
        beyond = self._dense[-1] * self.max_tokens / B.double()
        return torch.where(self.max_tokens >= B, inside, beyond)

    @classmethod
    def from_dict(cls, table: dict[int, float], meta: dict | None = None) -> SpsTable:
        """From ``{B: steps_per_s}``, e.g. a hand-made table in a test."""
        items = sorted((int(b), float(s)) for b, s in table.items())
        return cls(tuple(b for b, _ in items), tuple(s for _, s in items), dict(meta or {}))

    @classmethod
    def flat(cls, steps_per_s: float = 1.0, max_tokens: int = 4096) -> SpsTable:
        """A machine where a step costs the same at any size up to ``max_tokens``."""
        return cls((1, max_tokens), (steps_per_s, steps_per_s))

    def save(self, path: str | Path) -> None:
        payload = {"tokens": list(self.tokens), "steps_per_s": list(self.steps_per_s), "meta": self.meta}
        write_atomic(path, json.dumps(payload, indent=1), mkdir=True)

    @classmethod
    def load(cls, path: str | Path) -> SpsTable:
        data = json.loads(Path(path).read_text())
        return cls(tuple(data["tokens"]), tuple(data["steps_per_s"]), data.get("meta", {}))


def default_sizes(max_tokens: int) -> list[int]:
    """Batch-token sizes to profile: every size to 16, then steps of ~12% (at least 4)."""
    sizes = list(range(1, min(16, max_tokens) + 1))
    while sizes[-1] < max_tokens:
        sizes.append(min(max_tokens, sizes[-1] + max(4, round(sizes[-1] * 0.12))))
    return sizes


def measure_sps(
    step: Callable[[int], None],
    sizes: Sequence[int],
    *,
    repeats: int = 5,
    warmup: int = 1,
    meta: dict | None = None,
    progress: Callable[[int, float], None] | None = None,
    monotone: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> SpsTable:
    """Time ``step(B)`` for each size (fastest of ``repeats`` after ``warmup`` runs) on ``clock``.

    Sizes are measured in an interleaved order (small, large, small, ...) within each
    repeat so that slow drifts of a shared machine do not bend the curve one way; with
    ``monotone`` the step times are then fitted non-decreasing in B (:func:`non_decreasing`).
    """
    sizes = sorted(set(sizes))
    times: dict[int, list[float]] = {b: [] for b in sizes}
    for _ in range(warmup):
        for b in sizes[:: max(1, len(sizes) // 4)]:
            step(b)
    order = [b for pair in zip(sizes, reversed(sizes)) for b in pair][: len(sizes)]
    for _ in range(repeats):
        for b in order:
            started = clock()
            step(b)
            times[b].append(clock() - started)
    # The fastest run: on a shared machine the noise only ever adds time.
    best = [min(times[b]) for b in sizes]
    if progress is not None:
        for b, t in zip(sizes, best):
            progress(b, t)
    if monotone:
        best = non_decreasing(best)
    return SpsTable(tuple(sizes), tuple(1.0 / t for t in best), dict(meta or {}))


def non_decreasing(values: Sequence[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators).

    A step of more tokens never takes less time in expectation; on a shared machine the
    medians still zig-zag, and a spurious dip would look like a cliff to the scheduler.
    Real cliffs (time jumping *up* at a size) are kept.
    """
    blocks: list[list[float]] = []  # [sum, count] of pooled runs
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]
