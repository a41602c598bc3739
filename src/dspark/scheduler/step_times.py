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

    t̂(R, e) = a + c·R + b·e,    a, c, b >= 0,

``R`` the step's requests and ``e`` their rows beyond one each, with the line as its
prior: ``ρ = R / (a + c·R)`` and ``v(ℓ) = b·ℓ``. On the tiny target's engine steps at 16
requests ``c`` was 1.2-1.25 ms and ``b`` 0.4-0.6 ms, where the line priced both at 0.8-0.9 ms
(``scripts/bench_step_model.py --regression``).

A step time affine in the extra rows makes verification cost separable: ℓ more rows for
one request add ``b·ℓ`` to the step whatever the others verify, so the per-request
decision of ``scheduler/payoff.py`` prices the batch's shared step exactly. Only past
forwards are read, never a draft, so decisions priced with these stay lossless.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

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
    """Decayed sufficient statistics of points ``(x1, x2, y)`` for a least-squares plane."""

    memory: float = 0.95
    m: list[list[float]] = field(default_factory=lambda: [[0.0] * 4 for _ in range(4)])  # Σ w z zᵀ

    def observe(self, x1: float, x2: float, y: float) -> None:
        z = (1.0, x1, x2, y)  # [1, x1, x2, y]: the moments of the normal equations
        for i in range(4):
            row = self.m[i]
            for j in range(4):
                row[j] = self.memory * row[j] + z[i] * z[j]

    @property
    def w(self) -> float:
        return self.m[0][0]


def fit_plane(
    plane: DecayedPlane, prior: Sequence[tuple[float, float, float]] = (), prior_weight: float = 0.0
) -> tuple[float, float, float]:
    """``(a, c, b)``: the least-squares ``y ≈ a + c·x1 + b·x2`` with every coefficient ``>= 0``,
    over ``plane``'s points and ``prior`` points of total weight ``prior_weight`` (they keep a
    direction the points do not span at the prior's slope). The best of the non-negative
    solutions over every subset of the three coefficients (the constrained optimum is one)."""
    m = [row[:] for row in plane.m]
    if prior:  # the prior's moments (upper triangle, in locals: a plan prices this every step)
        s1 = sx1 = sx2 = sy = sx1x1 = sx1x2 = sx1y = sx2x2 = sx2y = syy = 0.0
        for x1, x2, y in prior:
            s1 += 1.0
            sx1 += x1
            sx2 += x2
            sy += y
            sx1x1 += x1 * x1
            sx1x2 += x1 * x2
            sx1y += x1 * y
            sx2x2 += x2 * x2
            sx2y += x2 * y
            syy += y * y
        pw = prior_weight / len(prior)
        upper = ((0, 0, s1), (0, 1, sx1), (0, 2, sx2), (0, 3, sy), (1, 1, sx1x1), (1, 2, sx1x2))
        upper += ((1, 3, sx1y), (2, 2, sx2x2), (2, 3, sx2y), (3, 3, syy))
        for i, j, v in upper:
            m[i][j] += pw * v
            if i != j:
                m[j][i] += pw * v
    if m[0][0] <= 0:
        return 0.0, 0.0, 0.0
    whole = _solve([r[:3] for r in m[:3]], [r[3] for r in m[:3]])
    if whole is not None and min(whole) >= 0:  # the unconstrained optimum is feasible: it is the one
        return whole[0], whole[1], whole[2]
    best, best_sse = (0.0, 0.0, 0.0), m[3][3]  # all zero: SSE = Σ w y²
    for subset in ((0, 1), (0, 2), (1, 2), (0,), (1,), (2,)):
        coef = _solve([[m[i][j] for j in subset] for i in subset], [m[i][3] for i in subset])
        if coef is None or min(coef) < 0:
            continue
        full = [0.0, 0.0, 0.0]
        for i, v in zip(subset, coef):
            full[i] = v
        # Σ w (y − βᵀz)² = Σ w y² − 2 βᵀ Σ w z y + βᵀ (Σ w z zᵀ) β
        sse = m[3][3] - 2 * sum(full[i] * m[i][3] for i in range(3))
        sse += sum(full[i] * full[j] * m[i][j] for i in range(3) for j in range(3))
        if sse < best_sse - 1e-18:
            best, best_sse = (full[0], full[1], full[2]), sse
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


@dataclass
class StepTimes:
    """Observed step seconds fitted affine in the step's rows, over a profile prior, and
    separately in its requests and their extra (verification) rows."""

    profile: SpsTable
    memory: float = 0.95  # weight of the past per observation (~20 steps)
    prior_weight: float = 2.0  # pseudo-observations behind the profile's shape
    line: DecayedLine = field(init=False)
    plane: DecayedPlane = field(init=False)  # (requests, extra rows) -> seconds
    scale_sum: float = 0.0  # decayed Σ t_obs / t_profile over every size
    scale_count: float = 0.0
    # (lo, hi) -> (a, b) and (R, K) -> (a, c, b) since the last observation: a round prices the
    # same sizes more than once
    _fits: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.line = DecayedLine(self.memory)
        self.plane = DecayedPlane(self.memory)

    def observe(self, num_tokens: int, seconds: float, num_requests: int | None = None) -> None:
        """One forward of ``num_tokens`` decode/verification rows of ``num_requests`` requests
        (default: one row each, plain decoding) took ``seconds``."""
        R = num_tokens if num_requests is None else num_requests
        if num_tokens < 1 or seconds <= 0 or not 1 <= R <= num_tokens:
            return
        self._fits.clear()
        self.line.observe(float(num_tokens), seconds)
        self.plane.observe(float(R), float(num_tokens - R), seconds)
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

    def step_model(self, num_requests: int, K: int) -> tuple[float, float, float]:
        """``(a, c, b)`` of ``t̂(R, e) = a + c·R + b·e`` for a step of ``R`` requests verifying ``e``
        rows beyond their one each, for pricing ``R`` requests and up to ``K`` drafts each.

        A request's first row and its verified drafts do not cost the same: the first reads the
        request's whole KV cache and carries its sampling and bookkeeping, the others reuse them
        (tiny target, engine steps of up to 16 requests: 1.2-1.25 ms per request and 0.4-0.6 ms
        per extra row, where one line in rows priced both at 0.8-0.9 ms). The
        line's prices are the prior: :meth:`fit` at ``R - 1`` requests fewer or ``R·K`` rows
        more, so where the steps seen do not tell the two apart (one batch size, or no
        drafting) the plane is the line."""
        R = max(num_requests, 1)
        key = ("plane", R, K)
        if key not in self._fits:
            la, lb = self.fit(R, R * (K + 1))
            prior = [(float(r), 0.0, la + lb * r) for r in prior_sizes(1, R)]
            prior += [(float(R), float(e), la + lb * (R + e)) for e in prior_sizes(1, max(R * K, 1))]
            self._fits[key] = fit_plane(self.plane, prior, self.prior_weight)
        return self._fits[key]

    def seconds(self, num_tokens: int, *, span: int = 1) -> float:
        """``t̂`` of a plain step of ``num_tokens`` requests, priced for up to ``span − 1`` drafts each
        (the profile's own before any step)."""
        B = max(num_tokens, 1)
        if not self.line.w:
            return 1.0 / self.profile(B)
        a, c, _ = self.step_model(B, span - 1)
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
        a, c, b = self.step_model(R, K)
        return tuple(b * ell for ell in range(K + 1)), R / max(a + c * R, 1e-9)

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
