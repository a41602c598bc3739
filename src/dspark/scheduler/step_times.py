"""Step and drafting costs as the engine observes them, fitted affine in size (issue 17).

The payoff controller prices verification and drafting in seconds. The SPS profile was
measured once, under that moment's load and context lengths; on a shared CPU the same
forward can cost 1.5× more an hour later, and a profile taken during a burst of other
work is a staircase (verifying one extra token per request priced at +44 % of a step,
two to six at +54 %). Means per step size do not fix it at c >= 4: the sizes the engine
runs spread over 4..32 rows and few are seen often enough. So every engine step without
prefill (less the model drafter's own seconds, priced as drafting) is one point
``(B rows, seconds)`` of a decayed weighted least-squares line

    t̂(B) = a + b·B,    a, b >= 0,

fitted over all of them at once (any size informs every other). Before the first step
the profile is the price as it is; afterwards it is only a prior for the line's shape: a
few pseudo-points ``s · t_profile(B)`` at the sizes a query prices (``s``: decayed mean
of observed over profiled time), which pin the slope while the observations have no
spread (a batch that never drafts runs one size only) and are
outweighed once they do. Drafting seconds are fitted the same way against the number of
requests drafting together (:class:`DraftCosts`): the intercept is the per-call cost
the drafting requests of a round share, the slope what each one adds.

A row is not a row, though: a request's first row reads its whole KV cache and carries
its sampling and bookkeeping, and the drafts it verifies reuse them. The prices come from
a plane over the same steps (:meth:`StepTimes.step_model`),

    t̂(R, e) = a + c·R + b·e + j·[e > 0],    a, c, b, j >= 0,

``R`` the step's requests and ``e`` their rows beyond one each, with the line as its
prior: ``ρ = R / (a + c·R)`` and ``v(ℓ) = b·ℓ``. On the tiny target's engine steps at 16
requests ``c`` was 1.2-1.25 ms and ``b`` 0.4-0.6 ms, where the line priced both at 0.8-0.9 ms
(``scripts/bench_step_model.py --regression``). A step in which any request verifies also
pays a fixed ``j`` (a second attention group, verification's own fixed work), shared by the
requests that draft in it like a drafter call's fixed part.

Beyond ``j``, a step time affine in the extra rows makes verification cost separable: ℓ more
rows for one request add ``b·ℓ`` to the step whatever the others verify, so the per-request
decision of ``scheduler/payoff.py`` prices the batch's shared step exactly, and whether the
requests drafting together repay ``j`` is one sum
(:func:`~dspark.scheduler.shared_costs.verification_pays`). Only past
forwards are read, never a draft, so decisions priced with these stay lossless.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from dspark.scheduler.profile import SpsTable


@dataclass
class DecayedLine:
    """Decayed sufficient statistics of points ``(x, y)`` for a least-squares line."""

    memory: float = 0.95  # weight of the past per observation
    w: float = 0.0  # Σ w
    wx: float = 0.0  # Σ w x
    wxx: float = 0.0  # Σ w x²
    wy: float = 0.0  # Σ w y
    wxy: float = 0.0  # Σ w x y

    def observe(self, x: float, y: float) -> None:
        m = self.memory
        self.w = m * self.w + 1.0
        self.wx = m * self.wx + x
        self.wxx = m * self.wxx + x * x
        self.wy = m * self.wy + y
        self.wxy = m * self.wxy + x * y

    def spread(self) -> float:
        """Weighted variance of the observed ``x``."""
        return self.wxx / self.w - (self.wx / self.w) ** 2 if self.w else 0.0


def fit_line(
    line: DecayedLine, prior: Sequence[tuple[float, float]] = (), prior_weight: float = 0.0
) -> tuple[float, float]:
    """``(a, b)``: the least-squares line ``y ≈ a + b x`` with ``a, b >= 0`` over ``line``'s
    points and ``prior`` points of total weight ``prior_weight``; ``(0, 0)`` without points.

    The constrained optimum is the unconstrained one if feasible, else the best of the
    boundary fits (``b = 0``: the mean; ``a = 0``: through the origin).
    """
    pw = prior_weight / len(prior) if prior else 0.0
    w = line.w + pw * len(prior)
    if w <= 0:
        return 0.0, 0.0
    wx = line.wx + pw * sum(x for x, _ in prior)
    wxx = line.wxx + pw * sum(x * x for x, _ in prior)
    wy = line.wy + pw * sum(y for _, y in prior)
    wxy = line.wxy + pw * sum(x * y for x, y in prior)
    det = w * wxx - wx * wx
    if det > 1e-12 * max(w * wxx, 1e-300):
        b = (w * wxy - wx * wy) / det
        a = (wy - b * wx) / w
        if a >= 0 and b >= 0:
            return a, b
    candidates = [(wy / w, 0.0)]
    if wxx > 0:
        candidates.append((0.0, max(wxy / wxx, 0.0)))

    def sse(ab: tuple[float, float]) -> float:  # Σ w (y - a - b x)², up to the constant Σ w y²
        a, b = ab
        return a * a * w + b * b * wxx + 2 * a * b * wx - 2 * a * wy - 2 * b * wxy

    return min(candidates, key=sse)


@dataclass
class DecayedPlane:
    """Decayed sufficient statistics of points ``(x_1 .. x_n, y)`` for a least-squares fit
    affine in the ``x``: the moments ``Σ w z zᵀ`` of ``z = [1, x_1 .. x_n, y]``."""

    memory: float = 0.95
    dims: int = 2  # n
    m: list[list[float]] = field(init=False)  # [n + 2, n + 2]

    def __post_init__(self) -> None:
        self.m = [[0.0] * (self.dims + 2) for _ in range(self.dims + 2)]

    def observe(self, xs: Sequence[float], y: float) -> None:
        z = (1.0, *xs, y)
        assert len(z) == self.dims + 2, (xs, self.dims)
        for zi, row in zip(z, self.m):
            for j, zj in enumerate(z):
                row[j] = self.memory * row[j] + zi * zj

    @property
    def w(self) -> float:
        return self.m[0][0]


def fit_plane(plane: DecayedPlane, ridge: Sequence[tuple[float, float]] = ()) -> tuple[float, ...]:
    """``(β_0 .. β_n)``: the least-squares ``y ≈ β_0 + Σ β_i·x_i`` with every coefficient ``>= 0``
    over ``plane``'s points, each coefficient ``k`` held by ``ridge[k] = (β⁰_k, λ_k)`` (a penalty
    ``λ_k (β_k − β⁰_k)²``: a pseudo-observation of that coefficient alone, which keeps a
    direction the points do not span at ``β⁰_k`` and gives way where they do). The best of the
    non-negative solutions over every subset of the coefficients (the constrained optimum is
    one); all zero without points."""
    n = plane.dims + 1  # coefficients
    m = [row[:] for row in plane.m]
    for k, (target, lam) in enumerate(ridge):
        m[k][k] += lam
        m[k][n] += lam * target
        m[n][k] += lam * target
        m[n][n] += lam * target * target
    if m[0][0] <= 0:
        return (0.0,) * n
    whole = _solve([r[:n] for r in m[:n]], [r[n] for r in m[:n]])
    if whole is not None and min(whole) >= 0:  # the unconstrained optimum is feasible: it is the one
        return tuple(whole)
    best, best_sse = (0.0,) * n, m[n][n]  # all zero: SSE = Σ w y²
    subsets = (s for k in range(n - 1, 0, -1) for s in itertools.combinations(range(n), k))
    for subset in subsets:
        coef = _solve([[m[i][j] for j in subset] for i in subset], [m[i][n] for i in subset])
        if coef is None or min(coef) < 0:
            continue
        # Σ w (y − βᵀz)² = Σ w y² − 2 βᵀ Σ w z y + βᵀ (Σ w z zᵀ) β over the subset
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


@functools.lru_cache(maxsize=256)
def prior_sizes(lo: int, hi: int) -> tuple[int, ...]:
    """Up to 8 sizes spread evenly over ``lo..hi``: where :meth:`StepTimes.fit` puts its prior."""
    n = min(hi - lo + 1, 8)
    return tuple(sorted({round(lo + (hi - lo) * i / max(n - 1, 1)) for i in range(n)}))


class StepModel(NamedTuple):
    """Seconds of an engine step of ``R`` requests verifying ``e`` rows beyond one each:
    ``a + c·R + b·e + j·[e > 0]`` (:meth:`StepTimes.step_model`)."""

    a: float  # per step
    c: float  # per request (its first row)
    b: float  # per verified row
    j: float  # once per step in which any request verifies

    def __call__(self, num_requests: int, extra: int) -> float:
        return self.a + self.c * num_requests + self.b * extra + (self.j if extra > 0 else 0.0)


@dataclass
class StepTimes:
    """Observed step seconds fitted affine in the step's rows, over a profile prior, and
    separately in its requests and their extra (verification) rows."""

    profile: SpsTable
    memory: float = 0.95  # weight of the past per observation (~20 steps)
    prior_weight: float = 2.0  # pseudo-observations behind the profile's shape
    slope_prior: float = 0.1  # pseudo-steps behind the plane's slopes (the line's) and j (0)
    line: DecayedLine = field(init=False)
    plane: DecayedPlane = field(init=False)  # (requests, extra rows, any verified) -> seconds
    scale_sum: float = 0.0  # decayed Σ t_obs / t_profile over every size
    scale_count: float = 0.0
    # (lo, hi) -> (a, b) and (R, K) -> StepModel since the last observation: a round prices the
    # same sizes more than once
    _fits: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.line = DecayedLine(self.memory)
        self.plane = DecayedPlane(self.memory, dims=3)

    def observe(self, num_tokens: int, seconds: float, num_requests: int | None = None) -> None:
        """One forward of ``num_tokens`` decode/verification rows of ``num_requests`` requests
        (default: one row each, plain decoding) took ``seconds``."""
        R = num_tokens if num_requests is None else num_requests
        if num_tokens < 1 or seconds <= 0 or not 1 <= R <= num_tokens:
            return
        self._fits.clear()
        self.line.observe(float(num_tokens), seconds)
        extra = float(num_tokens - R)
        self.plane.observe((float(R), extra, float(extra > 0)), seconds)
        self.scale_sum = self.memory * self.scale_sum + seconds * self.profile(num_tokens)
        self.scale_count = self.memory * self.scale_count + 1.0

    @property
    def scale(self) -> float:
        """Observed over profiled step time (1 before any observation)."""
        return self.scale_sum / self.scale_count if self.scale_count else 1.0

    def fit(self, lo: int, hi: int) -> tuple[float, float]:
        """``(a, b)`` of ``t̂(B) = a + b·B`` for pricing sizes ``lo..hi``: the prior's
        pseudo-points are the rescaled profile at those sizes."""
        lo, hi = max(lo, 1), max(hi, lo, 1)
        if (lo, hi) not in self._fits:
            s = self.scale
            prior = [(float(B), s / self.profile(B)) for B in prior_sizes(lo, hi)]
            self._fits[lo, hi] = fit_line(self.line, prior, self.prior_weight)
        return self._fits[lo, hi]

    def step_model(self, num_requests: int, K: int) -> StepModel:
        """:class:`StepModel` ``t̂(R, e) = a + c·R + b·e + j·[e > 0]`` for a step of ``R`` requests
        verifying ``e`` rows beyond their one each, for pricing ``R`` requests and up to ``K``
        drafts each.

        A request's first row and its verified drafts do not cost the same: the first reads the
        request's whole KV cache and carries its sampling and bookkeeping, the others reuse them
        (tiny target, engine steps of up to 16 requests: 1.2-1.25 ms per request and 0.4-0.6 ms
        per extra row, where one line in rows priced both at 0.8-0.9 ms). The
        line's slope is the prior of both slopes (:func:`fit_plane`'s ridge, worth
        ``slope_prior`` steps half the pricing range apart), so where the steps seen do not tell
        the two apart (one batch size, or no drafting) the plane prices as the line.

        A step in which any request verifies also pays ``j`` once: the verifying runs attend as
        a second group (``targets/flat.py``), and their sampling and bookkeeping have fixed
        parts (tiny target, DFlash at 4 requests: 3.1 ms, 1.9 ms of it in the forward, against a
        ~25 ms plain step; ``scripts/bench_step_model.py --regression``). Its prior is 0, so
        ``j`` is what steps with and without verification tell apart. The prior holds slopes
        only, never the level: pseudo-points on the line (the prior before ``j``) put the line's
        level wherever it differs from the steps' into ``j``, 5-8 ms at 40 requests from plain
        steps alone."""
        R = max(num_requests, 1)
        key = ("plane", R, K)
        if key not in self._fits:
            _, lb = self.fit(R, R * (K + 1))
            w = self.slope_prior
            ridge = ((0.0, 0.0), (lb, w * (R / 2) ** 2), (lb, w * (R * K / 2) ** 2), (0.0, w))
            self._fits[key] = StepModel(*fit_plane(self.plane, ridge))
        return self._fits[key]

    def seconds(self, num_tokens: int, *, span: int = 1) -> float:
        """``t̂`` of a plain step of ``num_tokens`` requests, priced for up to ``span − 1`` drafts each
        (the profile's own before any step)."""
        B = max(num_tokens, 1)
        if not self.line.w:
            return 1.0 / self.profile(B)
        a, c, _, _ = self.step_model(B, span - 1)
        return max(a + c * B, 1e-9)

    def verify_costs(self, num_requests: int, K: int) -> tuple[float, ...]:
        """``v(ℓ)``, ℓ = 0..K: seconds per request that verifying ℓ drafts each adds to a step of
        ``num_requests`` requests: ``b·ℓ`` once steps were observed (the same for any mix of
        lengths: ``t̂`` is affine in the extra rows); before, the profile's
        ``(t(R + Rℓ) − t(R)) / R``, kept non-decreasing (its cliffs as they are: nothing says
        otherwise yet)."""
        return self.prices(num_requests, K)[0]

    def prices(self, num_requests: int, K: int) -> tuple[tuple[float, ...], float]:
        """``(v(ℓ) for ℓ = 0..K, ρ)`` from one fit (:meth:`step_model`): ``v(ℓ) = b·ℓ`` and
        ``ρ = R / (a + c·R)``."""
        R = max(num_requests, 1)
        if not self.line.w:
            base, out, worst = 1.0 / self.profile(R), [], 0.0
            for ell in range(K + 1):
                worst = max(worst, (1.0 / self.profile(R + R * ell) - base) / R)
                out.append(worst)
            return tuple(out), R / base
        a, c, b, _ = self.step_model(R, K)
        return tuple(b * ell for ell in range(K + 1)), R / max(a + c * R, 1e-9)

    def verifying_step_s(self, num_requests: int, K: int) -> float:
        """``j``: seconds a step of ``num_requests`` requests pays once when any of them verifies
        (0 before any step: the profile has no such part)."""
        return self.step_model(num_requests, K).j if self.line.w else 0.0

    def tokens_per_s(self, num_requests: int, K: int = 0) -> float:
        """``ρ``: tokens per second plain decoding makes with ``num_requests`` requests."""
        return self.prices(num_requests, K)[1]


@dataclass
class DraftCosts:
    """Drafting seconds of one proposer fitted as ``d0 + d1·n`` for ``n`` requests drafting
    together: ``d0`` per call (shared), ``d1`` per request."""

    memory: float = 0.98  # weight of the past per call (~50 calls): the split is the hardware's
    min_spread: float = 0.25  # variance of n below which d0 and d1 cannot be told apart
    line: DecayedLine = field(init=False)

    def __post_init__(self) -> None:
        self.line = DecayedLine(self.memory)

    def observe(self, num_requests: int, seconds: float) -> None:
        if num_requests >= 1 and seconds >= 0:
            self.line.observe(float(num_requests), seconds)

    @property
    def observed(self) -> bool:
        return self.line.w > 0

    def split(self, shape: tuple[float, float] = (0.0, 1.0)) -> tuple[float, float]:
        """``(d0, d1)``. Until calls of several sizes were seen only their mean is known; it
        is split in the ratio of ``shape = (per call, per request)`` (e.g. the target's
        step line: a drafter forward is a forward too), by default all of it per request."""
        line = self.line
        if not line.w:
            return 0.0, 0.0
        if line.spread() < self.min_spread:
            n, y = line.wx / line.w, line.wy / line.w  # mean requests and seconds per call
            c0, c1 = max(shape[0], 0.0), max(shape[1], 0.0)
            if c0 + c1 * n <= 0:
                return 0.0, y / n
            k = y / (c0 + c1 * n)
            return k * c0, k * c1
        return fit_line(line)
