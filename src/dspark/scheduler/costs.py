"""Step and drafting seconds, fitted online from what the engine observes (DESIGN §9.0).

Every engine step without prefill is a point of a decayed non-negative least-squares fit
``t̂(R, e) = a + c·R + b·e`` (``R`` requests, ``e`` verified rows beyond one each: a
request's first row reads its KV cache and carries its sampling, its drafts reuse them), with
the SPS profile as prior: it prices alone before the first step and holds the slopes the
steps do not tell apart. Plain decoding makes ``ρ = R / (a + c·R)`` tokens a second;
verifying ``ℓ`` drafts adds ``v(ℓ) = b·ℓ`` per request. A proposer's calls are fitted as
``d0 + d1·n`` for ``n`` requests drafting together (:class:`DraftCosts`). Only past seconds
are read, never a draft: lossless.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from dspark.scheduler.profile import SpsTable


@dataclass
class DecayedFit:
    """Decayed moments ``Σ w z zᵀ`` of ``z = [1, x_1 .. x_n, y]`` for a fit affine in the ``x``."""

    dims: int = 1  # n
    memory: float = 0.95  # weight of the past per observation
    m: list[list[float]] = field(init=False)  # [n + 2, n + 2]

    def __post_init__(self) -> None:
        self.m = [[0.0] * (self.dims + 2) for _ in range(self.dims + 2)]

    def observe(self, xs: Sequence[float], y: float) -> None:
        z = (1.0, *xs, y)
        for zi, row in zip(z, self.m):
            for j, zj in enumerate(z):
                row[j] = self.memory * row[j] + zi * zj

    @property
    def weight(self) -> float:
        return self.m[0][0]

    def mean(self, i: int) -> float:
        """Weighted mean of ``z_i`` (``x_i`` for ``i = 1..n``, ``y`` for ``n + 1``)."""
        return self.m[0][i] / self.m[0][0] if self.m[0][0] else 0.0

    def spread(self, i: int = 1) -> float:
        """Weighted variance of ``x_i``."""
        return self.m[i][i] / self.m[0][0] - self.mean(i) ** 2 if self.m[0][0] else 0.0

    def fit(self, ridge: Sequence[tuple[float, float]] = ()) -> tuple[float, ...]:
        """``(β_0 .. β_n)`` of ``y ≈ β_0 + Σ β_i x_i``, every ``β >= 0``, each ``β_k`` held by
        ``ridge[k] = (β⁰_k, λ_k)`` (a penalty ``λ_k (β_k − β⁰_k)²``: where the points do not span
        a direction, it stays at ``β⁰_k``). The best non-negative solution over every subset of
        the coefficients (the constrained optimum is one of them); zeros without points."""
        n = self.dims + 1
        m = [row[:] for row in self.m]
        for k, (target, lam) in enumerate(ridge):
            m[k][k] += lam
            m[k][n] += lam * target
            m[n][k] += lam * target
            m[n][n] += lam * target * target
        if m[0][0] <= 0:
            return (0.0,) * n
        best, best_sse = (0.0,) * n, m[n][n]
        for size in range(n, 0, -1):
            for subset in itertools.combinations(range(n), size):
                coef = _solve([[m[i][j] for j in subset] for i in subset], [m[i][n] for i in subset])
                if coef is None or min(coef) < 0:
                    continue
                if size == n:  # the unconstrained optimum is feasible: it is the one
                    return tuple(coef)
                # Σ w (y − βᵀz)² over the subset, up to constants
                sse = m[n][n] - 2 * sum(c * m[i][n] for i, c in zip(subset, coef))
                sse += sum(ci * cj * m[i][j] for i, ci in zip(subset, coef) for j, cj in zip(subset, coef))
                if sse < best_sse - 1e-18:
                    full = [0.0] * n
                    for i, c in zip(subset, coef):
                        full[i] = c
                    best, best_sse = tuple(full), sse
        return best


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """``a x = b`` by Gaussian elimination with partial pivoting; None if (nearly) singular."""
    n = len(b)
    rows = [r[:] + [v] for r, v in zip(a, b)]
    scale = max(abs(v) for r in a for v in r) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) <= 1e-12 * scale:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(col + 1, n):
            f = rows[r][col] / rows[col][col]
            for k in range(col, n + 1):
                rows[r][k] -= f * rows[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (rows[r][n] - sum(rows[r][k] * x[k] for k in range(r + 1, n))) / rows[r][r]
    return x


@dataclass
class StepCosts:
    """``t̂(R, e) = a + c·R + b·e`` over the engine's steps, with the SPS profile as its prior."""

    profile: SpsTable
    memory: float = 0.95  # weight of the past per step (~20 steps)
    prior_steps: float = 0.1  # pseudo-steps behind the profile's slopes
    steps: DecayedFit = field(init=False)
    scale_sum: float = 0.0  # decayed Σ observed / profiled seconds
    _fits: dict = field(default_factory=dict, init=False, repr=False)  # (R, K) -> (a, c, b)

    def __post_init__(self) -> None:
        self.steps = DecayedFit(dims=2, memory=self.memory)

    def observe(self, num_requests: int, num_rows: int, seconds: float) -> None:
        """A step of ``num_rows`` decode/verification rows over ``num_requests`` requests."""
        if not 1 <= num_requests <= num_rows or seconds <= 0:
            return
        self._fits.clear()
        self.steps.observe((float(num_requests), float(num_rows - num_requests)), seconds)
        self.scale_sum = self.memory * self.scale_sum + seconds * self.profile(num_rows)

    def model(self, num_requests: int, K: int) -> tuple[float, float, float]:
        """``(a, c, b)`` for pricing ``num_requests`` requests verifying up to ``K`` drafts each."""
        R, K = max(num_requests, 1), max(K, 1)
        if (R, K) not in self._fits:
            scale = self.scale_sum / self.steps.weight if self.steps.weight else 1.0
            slope = scale * max(1.0 / self.profile(R * (K + 1)) - 1.0 / self.profile(R), 0.0) / (R * K)
            w = self.prior_steps  # pseudo-steps half the pricing range apart
            ridge = ((0.0, 0.0), (slope, w * (R / 2) ** 2), (slope, w * (R * K / 2) ** 2))
            self._fits[R, K] = self.steps.fit(ridge)
        return self._fits[R, K]

    def prices(self, num_requests: int, K: int) -> tuple[tuple[float, ...], float]:
        """``(v(ℓ) for ℓ = 0..K, ρ)``; before any step, the profile's own prices."""
        R = max(num_requests, 1)
        if not self.steps.weight:
            base, out, worst = 1.0 / self.profile(R), [], 0.0
            for ell in range(K + 1):  # kept non-decreasing
                worst = max(worst, (1.0 / self.profile(R + R * ell) - base) / R)
                out.append(worst)
            return tuple(out), R / base
        a, c, b = self.model(R, K)
        return tuple(b * ell for ell in range(K + 1)), R / max(a + c * R, 1e-9)


@dataclass
class DraftCosts:
    """One proposer's seconds per call, ``d0 + d1·n`` for ``n`` requests drafting together."""

    min_spread: float = 0.25  # variance of n below which d0 and d1 cannot be told apart
    calls: DecayedFit = field(default_factory=lambda: DecayedFit(dims=1, memory=0.98))  # ~50 calls

    def observe(self, num_requests: int, seconds: float) -> None:
        if num_requests >= 1 and seconds >= 0:
            self.calls.observe((float(num_requests),), seconds)

    @property
    def observed(self) -> bool:
        return self.calls.weight > 0

    def split(self, shape: tuple[float, float] = (0.0, 1.0)) -> tuple[float, float]:
        """``(d0, d1)``. While every call had about the same size only their mean is known; it
        is split in the ratio ``shape = (per call, per request)`` (a drafter forward is a
        forward too: the target step's ratio over the rows a request adds)."""
        if not self.observed:
            return 0.0, 0.0
        if self.calls.spread() >= self.min_spread:
            d0, d1 = self.calls.fit()
            return d0, d1
        n, y = self.calls.mean(1), self.calls.mean(2)
        c0, c1 = max(shape[0], 0.0), max(shape[1], 0.0)
        if c0 + c1 * n <= 0:
            return 0.0, y / n
        k = y / (c0 + c1 * n)
        return k * c0, k * c1
