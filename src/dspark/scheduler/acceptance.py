"""Acceptance estimates and the best verification length: the controller's math (DESIGN §9.0).

A request's acceptance with one proposer is ``e`` (first draft accepted) and ``q`` (a later
draft accepted given the previous was): verifying ``ℓ`` drafts accepts ``E(ℓ) = e Σ_{k<ℓ} q^k``
in expectation, and costs ``d + v(ℓ)`` seconds in which plain decoding makes ``ρ·(d + v(ℓ))``
tokens, so its net gain is ``G(ℓ) = E(ℓ) − ρ·(d + v(ℓ))`` (:func:`best_length`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class AcceptanceCounts:
    """Decayed counts of verified outcomes: one request with one proposer, or a pool of them."""

    first_tested: float = 0.0
    first_accepted: float = 0.0
    later_tested: float = 0.0
    later_accepted: float = 0.0
    rounds: int = 0  # observed rounds, undecayed

    def observe(self, verified: int, accepted: int, memory: float) -> None:
        """A round that verified ``verified`` drafts and accepted the first ``accepted``."""
        if verified <= 0:
            return
        # Draft k >= 2 is tested iff drafts 1..k-1 were accepted, and accepted iff it is too.
        later_tested = max(0, min(accepted + 1, verified) - 1)
        self.rounds += 1
        self.first_tested = memory * self.first_tested + 1.0
        self.first_accepted = memory * self.first_accepted + float(accepted > 0)
        if later_tested:
            w = memory**later_tested
            self.later_tested = w * self.later_tested + later_tested
            self.later_accepted = w * self.later_accepted + max(0, accepted - 1)

    def rates(self, prior: tuple[float, float], strength: float) -> tuple[float, float]:
        """``(e, q)``, shrunk to ``prior`` with ``strength`` pseudo-rounds behind it (the prior
        itself where there is neither evidence nor strength)."""
        n_first, n_later = self.first_tested + strength, self.later_tested + strength
        e = (self.first_accepted + strength * prior[0]) / n_first if n_first > 0 else prior[0]
        q = (self.later_accepted + strength * prior[1]) / n_later if n_later > 0 else prior[1]
        return e, q


def expected_accepted(e: float, q: float, length: int) -> float:
    """``E(ℓ) = e Σ_{k<ℓ} q^k``."""
    return sum(e * q**k for k in range(max(length, 0)))


def best_length(
    e: float, q: float, cap: int, *, verify_s: Sequence[float], rho: float, draft_s: float = 0.0
) -> tuple[float, int]:
    """``(G, ℓ)``: the best net gain in tokens over ``ℓ = 1..cap`` and its ``ℓ``;
    ``verify_s[ℓ]`` is ``v(ℓ)``. ``(-inf, 0)`` when nothing can be verified."""
    cap = min(cap, len(verify_s) - 1)
    gain, best, best_ell = 0.0, -math.inf, 0
    for k in range(max(cap, 0)):
        gain += e * q**k
        net = gain - rho * verify_s[k + 1]
        if net > best:
            best, best_ell = net, k + 1
    return best - rho * draft_s, best_ell


def probe_cost(
    e: float, q: float, length: int, *, verify_s: Sequence[float], rho: float, draft_s: float
) -> float:
    """Tokens a probe verifying ``length`` drafts is expected to cost (``>= 0``), net of what it
    is expected to accept; ``inf`` when drafting could not pay even if every draft were
    accepted (no outcome of the probe could change the verdict)."""
    K = len(verify_s) - 1
    perfect = max((ell - rho * (verify_s[ell] + draft_s) for ell in range(1, K + 1)), default=0.0)
    if perfect <= 0 or min(length, K) < 1:
        return math.inf
    length = min(length, K)
    return max(0.0, rho * (draft_s + verify_s[length]) - expected_accepted(e, q, length))


def shadow_outcome(proposal: Sequence[int], emitted: Sequence[int]) -> tuple[int, int] | None:
    """What verifying a deterministic ``proposal`` would have given, from the tokens the request
    ``emitted`` since it was made: ``(verified, accepted)``, or None while they match it so far
    without covering it. The emitted tokens have the target's distribution whoever drafted
    them, so "emitted = proposed" happens with probability ``p(x)``, the acceptance
    probability of a one-hot draft: an unbiased observation that costs nothing."""
    matched = 0
    for drafted, actual in zip(proposal, emitted):
        if drafted != actual:
            return len(proposal), matched
        matched += 1
    return (len(proposal), matched) if matched == len(proposal) else None
