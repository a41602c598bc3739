"""Verification scheduling: how many of each request's drafts to verify this step (SPEC §9).

Every policy is a pure function from the drafts' confidences ``c [R, K]`` (predicted
conditional acceptance, SPEC §2), per-request caps ``[R]`` and, for the hardware-aware
ones, the profiled SPS table, to verification lengths ``ℓ [R]`` with ``0 <= ℓ_r <= cap_r``.

Why these are lossless. Speculative sampling keeps the target distribution for any
verification length as long as the decision to verify draft ``x_k`` does not depend on
``x_k`` itself (the *non-anticipating* property, paper §3.2.2 and Appendix A): the
decision may use the history, ``x_<k`` and anything independent of ``x_k``. So a
confidence ``c_k`` may depend on ``x_<k`` (DSpark's head reads ``x_{k-1}``) but never on
``x_k``, and:

- ``fixed`` / ``fixed:k`` depend on no draft at all;
- ``threshold:t`` admits ``x_k`` iff ``c_1..c_k >= t``: a function of ``x_<k``;
- ``prefix`` (Algorithm 1) admits candidates in descending survival ``a_{r,j}`` and
  *stops at the first one that does not raise throughput*. Candidates after ``(r, k)``
  in that order include ``(r, k+1..)``, whose survival depends on ``x_k``; the break
  means the decision on ``(r, k)`` never looks at them. Ties sort by position, so
  ``(r, k)`` always precedes ``(r, k+1)``.
- a *global* search (no break, :func:`global_search`) picks the best prefix of the whole
  ranking, which looks at ``a_{r,k+1}`` before deciding on ``x_k``: with current
  confidences it biases the output (Appendix A, pinned by a test). ``prefix-async``
  (paper §5.2) uses it only to size a budget from confidences of *two steps earlier*,
  independent of this step's drafts, then admits the top-``budget`` current candidates
  by current survival: the rank of ``(r, k)`` depends only on candidates ranked above it.

Per-request caps must be known before the drafts are (block size, remaining
``max_tokens``), or come from a drafter that decides its length left to right.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dspark.scheduler.profile import SpsTable

POLICY_KINDS = ("fixed", "threshold", "prefix", "prefix-async")


@dataclass(frozen=True, kw_only=True)
class Policy:
    """A parsed policy spec: ``fixed``, ``fixed:k``, ``threshold:t``, ``prefix``, ``prefix-async``."""

    kind: str
    k: int | None = None  # fixed:k
    threshold: float | None = None  # threshold:t
    lag: int = 2  # prefix-async: the budget uses confidences this many steps old (paper §5.2)

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise ValueError(f"unknown policy {self.kind!r}; choose from {', '.join(POLICY_KINDS)}")
        if self.k is not None and self.k < 0:
            raise ValueError(f"fixed:k needs k >= 0, got {self.k}")
        if self.kind == "threshold" and not (self.threshold is not None and 0.0 <= self.threshold <= 1.0):
            raise ValueError(f"threshold:t needs t in [0, 1], got {self.threshold}")
        if self.lag < 1:
            raise ValueError(f"prefix-async lag must be >= 1, got {self.lag}")

    @property
    def needs_confidences(self) -> bool:
        return self.kind != "fixed"

    @property
    def needs_sps(self) -> bool:
        return self.kind in ("prefix", "prefix-async")

    def __str__(self) -> str:
        if self.kind == "fixed" and self.k is not None:
            return f"fixed:{self.k}"
        if self.kind == "threshold":
            return f"threshold:{self.threshold:g}"
        return self.kind


def parse_policy(spec: str | Policy) -> Policy:
    """``"fixed" | "fixed:k" | "threshold:t" | "prefix" | "prefix-async"`` → :class:`Policy`."""
    if isinstance(spec, Policy):
        return spec
    name, _, arg = spec.strip().partition(":")
    try:
        if name == "fixed":
            return Policy(kind="fixed", k=int(arg) if arg else None)
        if name == "threshold":
            return Policy(kind="threshold", threshold=float(arg) if arg else None)
    except ValueError as e:
        raise ValueError(f"bad policy {spec!r}: {e}") from None
    if arg:
        raise ValueError(f"policy {name!r} takes no argument, got {spec!r}")
    return Policy(kind=name)


# -- the policies, as pure functions -----------------------------------------------------


def survival(confidences: Tensor) -> Tensor:
    """Prefix survival ``a_{r,j} = Π_{i<=j} c_{r,i}`` ``[R, K]`` (SPEC §2)."""
    return confidences.double().clamp(0.0, 1.0).cumprod(dim=-1)


def fixed_lengths(caps: Tensor, k: int | None = None) -> Tensor:
    """Verify everything (``fixed``) or at most ``k`` drafts (``fixed:k``)."""
    return caps.clone() if k is None else caps.clamp(max=k)


def threshold_lengths(confidences: Tensor, caps: Tensor, t: float) -> Tensor:
    """Cut at the first ``c_k < t`` (static threshold)."""
    keep = (confidences >= t).long().cumprod(dim=-1).sum(dim=-1)  # [R] leading run of c >= t
    return torch.minimum(keep, caps)


def _ranked_candidates(confidences: Tensor, caps: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Candidates ``(r, j)`` with ``j <= cap_r`` and ``a_{r,j} > 0``, by descending survival.

    Returns requests ``[n]``, positions ``[n]`` (1-based) and survivals ``[n]``. Ties keep
    position order (a stable sort over candidates laid out position-major), so every
    request's candidates come in prefix order.
    """
    R, K = confidences.shape
    a = survival(confidences)  # [R, K]
    j = torch.arange(1, K + 1).expand(R, K)  # [R, K]
    r = torch.arange(R).unsqueeze(-1).expand(R, K)  # [R, K]
    ok = (j <= caps.unsqueeze(-1)) & (a > 0)  # [R, K]
    a, j, r = a.T[ok.T], j.T[ok.T], r.T[ok.T]  # position-major flattening
    order = torch.sort(a, descending=True, stable=True).indices
    return r[order], j[order], a[order]


def _throughputs(a_sorted: Tensor, num_requests: int, base_tokens: int, sps: SpsTable) -> Tensor:
    """``Θ_i`` after admitting the first i candidates, i = 0..n: ``τ*_i · SPS(B_i)`` ``[n + 1]``."""
    n = a_sorted.shape[0]
    tau = num_requests + torch.cat([a_sorted.new_zeros(1), a_sorted.cumsum(0)])  # [n + 1]
    batch = num_requests + base_tokens + torch.arange(n + 1)  # [n + 1]
    return tau * sps.lookup(batch)


def _lengths_from(requests: Tensor, positions: Tensor, admitted: int, R: int) -> Tensor:
    lengths = torch.zeros(R, dtype=torch.long)
    if admitted:
        lengths.scatter_reduce_(0, requests[:admitted], positions[:admitted], reduce="amax")
    return lengths


def prefix_lengths(confidences: Tensor, caps: Tensor, sps: SpsTable, *, base_tokens: int = 0) -> Tensor:
    """Paper Algorithm 1 with early stopping: admit by survival while ``Θ`` strictly rises.

    ``base_tokens`` are tokens of the same forward that are not speculation (prefill
    chunks); they count in ``B`` from the start. ``R`` anchors count in ``B`` and in ``τ*``.
    """
    R = confidences.shape[0]
    requests, positions, a = _ranked_candidates(confidences, caps)
    theta = _throughputs(a, R, base_tokens, sps)  # [n + 1]
    rising = (theta[1:] > theta[:-1]).long()  # Θ_i > Θ_best = Θ_{i-1} while it keeps rising
    admitted = int(rising.cumprod(0).sum())  # stop at the first non-improvement (line 13)
    return _lengths_from(requests, positions, admitted, R)


def global_search(confidences: Tensor, caps: Tensor, sps: SpsTable, *, base_tokens: int = 0) -> Tensor:
    """Algorithm 1 *without* the break: the best prefix of the whole ranking.

    Not lossless on current confidences (Appendix A); :func:`prefix_async_lengths` uses
    it on stale ones only.
    """
    R = confidences.shape[0]
    requests, positions, a = _ranked_candidates(confidences, caps)
    theta = _throughputs(a, R, base_tokens, sps)
    admitted = int(torch.argmax(theta))  # first occurrence of the maximum
    return _lengths_from(requests, positions, admitted, R)


def prefix_async_lengths(
    confidences: Tensor,
    caps: Tensor,
    stale_confidences: Tensor,
    stale_caps: Tensor,
    sps: SpsTable,
    *,
    base_tokens: int = 0,
) -> Tensor:
    """Paper §5.2: a global search over confidences ``lag`` steps old sets the budget; the
    current candidates are admitted top-``budget`` by current survival.

    ``stale_confidences [R, K]`` holds, for each current request, its confidences from
    ``lag`` steps earlier (or a prior for a request that is newer than that);
    ``stale_caps`` must not depend on this step's drafts either.
    """
    R = confidences.shape[0]
    budget = int(global_search(stale_confidences, stale_caps, sps, base_tokens=base_tokens).sum())
    requests, positions, _ = _ranked_candidates(confidences, caps)
    return _lengths_from(requests, positions, min(budget, requests.shape[0]), R)


def schedule(
    policy: Policy,
    caps: Tensor,
    confidences: Tensor | None = None,
    *,
    sps: SpsTable | None = None,
    base_tokens: int = 0,
    stale_confidences: Tensor | None = None,
    stale_caps: Tensor | None = None,
) -> Tensor:
    """Verification lengths ``[R]`` under ``policy``; see the module docstring for the inputs."""
    R = caps.shape[0]
    caps = caps.long().cpu()
    if R == 0 or policy.kind == "fixed":
        return fixed_lengths(caps, policy.k)
    assert confidences is not None and confidences.shape[0] == R, "this policy needs confidences [R, K]"
    confidences = confidences.detach().double().cpu()
    if policy.kind == "threshold":
        return threshold_lengths(confidences, caps, policy.threshold)
    assert sps is not None, f"policy {policy} needs an SPS table"
    if policy.kind == "prefix":
        return prefix_lengths(confidences, caps, sps, base_tokens=base_tokens)
    assert stale_confidences is not None and stale_caps is not None, "prefix-async needs stale confidences"
    return prefix_async_lengths(
        confidences,
        caps,
        stale_confidences.detach().double().cpu(),
        stale_caps.long().cpu(),
        sps,
        base_tokens=base_tokens,
    )
