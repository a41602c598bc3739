"""Verification scheduling: how many of each request's drafts to verify this step (DESIGN §9).

Every policy is a pure function from the drafts' confidences ``c [R, K]`` (predicted
conditional acceptance, DESIGN §2), per-request caps ``[R]`` and, for the hardware-aware
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dspark.scheduler.profile import SpsTable


@dataclass(frozen=True, kw_only=True)
class Policy:
    """A parsed policy spec: ``fixed``, ``fixed:k``, ``threshold:t``, ``prefix``, ``prefix-async``."""

    kind: str
    k: int | None = None  # fixed:k
    threshold: float | None = None  # threshold:t
    lag: int = 2  # prefix-async: the budget uses confidences this many steps old (paper §5.2)

    def __post_init__(self) -> None:
        if self.kind not in POLICIES:
            raise ValueError(f"unknown policy {self.kind!r}; choose from {', '.join(POLICIES)}")
        if self.k is not None and self.k < 0:
            raise ValueError(f"fixed:k needs k >= 0, got {self.k}")
        if self.kind == "threshold" and not (self.threshold is not None and 0.0 <= self.threshold <= 1.0):
            raise ValueError(f"threshold:t needs t in [0, 1], got {self.threshold}")
        if self.lag < 1:
            raise ValueError(f"prefix-async lag must be >= 1, got {self.lag}")

    @property
    def rule(self) -> PolicyRule:
        return POLICIES[self.kind]

    @property
    def needs_confidences(self) -> bool:
        return self.rule.needs_confidences

    @property
    def needs_sps(self) -> bool:
        return self.rule.needs_sps

    def __str__(self) -> str:
        if self.k is not None:
            return f"{self.kind}:{self.k}"
        if self.threshold is not None:
            return f"{self.kind}:{self.threshold:g}"
        return self.kind


def parse_policy(spec: str | Policy) -> Policy:
    """``"fixed" | "fixed:k" | "threshold:t" | "prefix" | "prefix-async"`` → :class:`Policy`."""
    if isinstance(spec, Policy):
        return spec
    name, _, arg = spec.strip().partition(":")
    rule = POLICIES.get(name)
    if rule is not None and rule.argument is not None:
        try:
            return Policy(kind=name, **rule.argument(arg))
        except ValueError as e:
            raise ValueError(f"bad policy {spec!r}: {e}") from None
    if arg:
        raise ValueError(f"policy {name!r} takes no argument, got {spec!r}")
    return Policy(kind=name)


# -- the policies, as pure functions -----------------------------------------------------


def survival(confidences: Tensor) -> Tensor:
    """Prefix survival ``a_{r,j} = Π_{i<=j} c_{r,i}`` ``[R, K]`` (DESIGN §2)."""
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


# -- the registry -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StepInputs:
    """What a policy may read besides the caps and current confidences: all known beforehand."""

    sps: SpsTable | None = None
    base_tokens: int = 0  # tokens of the same forward that are not speculation (prefill chunks)
    stale_confidences: Tensor | None = None  # [R, K] from ``lag`` steps earlier (``reads_history``)
    stale_caps: Tensor | None = None  # [R], independent of this step's drafts


Lengths = Callable[[Policy, Tensor, "Tensor | None", StepInputs], Tensor]  # -> ℓ [R]


@dataclass(frozen=True, kw_only=True)
class PolicyRule:
    """One row of :data:`POLICIES`: a policy's spelling, what it reads, and its lengths function."""

    name: str
    lengths: Lengths
    argument: Callable[[str], dict] | None = None  # the text after ':' → Policy fields
    spelling: str | None = None  # how --help writes it (None: the name)
    needs_confidences: bool = True
    needs_sps: bool = False
    reads_history: bool = False  # needs confidences of earlier steps (:func:`stale_history`)


def _optional(convert: Callable[[str], object], field: str) -> Callable[[str], dict]:
    return lambda arg: {field: convert(arg) if arg else None}


def _prefix_async(policy: Policy, caps: Tensor, conf: Tensor | None, x: StepInputs) -> Tensor:
    assert x.stale_confidences is not None and x.stale_caps is not None, "prefix-async needs stale inputs"
    stale, stale_caps = x.stale_confidences.detach().double().cpu(), x.stale_caps.long().cpu()
    return prefix_async_lengths(conf, caps, stale, stale_caps, x.sps, base_tokens=x.base_tokens)


POLICIES: dict[str, PolicyRule] = {
    rule.name: rule
    for rule in (
        PolicyRule(
            name="fixed",
            lengths=lambda p, caps, conf, x: fixed_lengths(caps, p.k),
            argument=_optional(int, "k"),
            spelling="fixed | fixed:k",
            needs_confidences=False,
        ),
        PolicyRule(
            name="threshold",
            lengths=lambda p, caps, conf, x: threshold_lengths(conf, caps, p.threshold),
            argument=_optional(float, "threshold"),
            spelling="threshold:t",
        ),
        PolicyRule(
            name="prefix",
            lengths=lambda p, caps, conf, x: prefix_lengths(conf, caps, x.sps, base_tokens=x.base_tokens),
            needs_sps=True,
        ),
        PolicyRule(name="prefix-async", lengths=_prefix_async, needs_sps=True, reads_history=True),
    )
}
POLICY_KINDS = tuple(POLICIES)


def policy_spellings() -> str:
    """``"fixed | fixed:k | threshold:t | ..."``: every row of :data:`POLICIES`, for help texts."""
    return " | ".join(rule.spelling or rule.name for rule in POLICIES.values())


def stale_history(
    histories: Sequence[Sequence[tuple[int, Tensor]]], step: int, lag: int, prior: Tensor, K: int
) -> Tensor:
    """``[R, K]``: per request, its newest confidences recorded at least ``lag`` steps before
    ``step`` (paper §5.2), resized to K positions; missing positions (and requests newer
    than the lag) take ``prior [>= K]``. Nothing from ``step`` itself can enter."""
    rows = []
    for history in histories:
        row = prior[:K].clone()
        conf = next((c for recorded_at, c in reversed(history) if recorded_at <= step - lag), None)
        if conf is not None:
            n = min(K, conf.shape[0])
            row[:n] = conf[:n]
        rows.append(row)
    return torch.stack(rows) if rows else prior.new_zeros(0, K)


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
    rule = policy.rule
    inputs = StepInputs(
        sps=sps, base_tokens=base_tokens, stale_confidences=stale_confidences, stale_caps=stale_caps
    )
    if R == 0 or not rule.needs_confidences:
        return rule.lengths(policy, caps, None, inputs) if R else caps.clone()
    assert confidences is not None and confidences.shape[0] == R, "this policy needs confidences [R, K]"
    confidences = confidences.detach().double().cpu()
    assert sps is not None or not rule.needs_sps, f"policy {policy} needs an SPS table"
    return rule.lengths(policy, caps, confidences, inputs)
