"""The speculation controller: per request and round, which proposer drafts and how far (DESIGN §9.0).

Two calls: :meth:`Controller.plan` takes each decoding request's :class:`Offer` (the most
drafts each proposer can offer it) and the round's :class:`RoundCosts`, and returns a
:class:`Spec` per request (a proposer or none, a cap, whether it is a probe);
:meth:`Controller.observe` takes what a round verified and accepted. Its state is plain
numbers keyed by request; its math is ``scheduler/acceptance.py``. A request drafts with
the proposer of the best positive net gain ``G = w·E(ℓ) − ρ·(d + v(ℓ))`` (``w``: the drain
value), within three rules that DESIGN §9.0 defines and the methods below cite: shared
calls (1), probes (2) and shadows (3, the engine's part).

Lossless: every choice reads the history only, never a draft it admits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from dspark.scheduler.acceptance import AcceptanceCounts, best_length, probe_cost


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    prior_first: float = 0.5  # e before any evidence: optimistic, so every proposer is tried
    prior_later: float = 0.7  # q before any evidence
    prior_strength: float = 2.0  # pseudo-rounds behind those priors, fading as rounds come in
    pool_strength: float = 4.0  # pseudo-rounds behind the pooled rates in a request's own
    memory: float = 0.9  # a request's weight of the past per round: texts change character
    pool_memory: float = 0.99  # the pool's, per observed round
    probe_every: int = 8  # rounds without drafting before the first probe
    probe_max: int = 64  # the probe interval doubles up to this
    probe_length: int = 2  # drafts a probe verifies
    probe_budget: float = 0.02  # most probes may cost, as a share of plain decoding's tokens

    def __post_init__(self) -> None:
        rates = 0 <= self.prior_first <= 1 and 0 <= self.prior_later <= 1
        decays = 0 <= self.memory < 1 and 0 <= self.pool_memory < 1
        positive = self.prior_strength >= 0 and self.pool_strength >= 0
        probes = 1 <= self.probe_every <= self.probe_max and self.probe_length >= 1 and self.probe_budget > 0
        if not (rates and decays and positive and probes):
            raise ValueError(f"bad controller config {self}")


@dataclass(frozen=True)
class Offer:
    """What one request can do this round: ``caps[p]`` drafts at most from proposer ``p`` (0: none)."""

    key: int
    caps: Mapping[str, int]


@dataclass(frozen=True)
class RoundCosts:
    """What a round costs at this batch, in seconds."""

    rho: float  # plain decoding's tokens per second
    verify_s: tuple[float, ...]  # v(ℓ), ℓ = 0..K: what verifying ℓ drafts of one request adds
    draft_s: Mapping[str, float]  # per proposer, per drafting request
    call_s: Mapping[str, float] = field(default_factory=dict)  # per proposer, per call (shared)
    # The share of a plain step's seconds an accepted draft saves only when every request gains
    # together: a/(a + c·R) while the batch drains (nobody waits for a slot), else 0.
    fixed_share: float = 0.0
    value: float = 1.0  # w: an accepted draft's worth in tokens of plain decoding (the drain value)


@dataclass(frozen=True)
class Spec:
    """This round for one request: draft with ``proposer`` (None: decode plainly), verify at most ``cap``."""

    proposer: str | None = None
    cap: int = 0
    probe: bool = False


@dataclass
class _Request:
    counts: dict[str, AcceptanceCounts] = field(default_factory=dict)
    skipped: int = 0  # rounds without drafting with a probed proposer
    interval: int = 0  # rounds between probes now


class Controller:
    """Plans rounds from the requests' histories; ``proposers`` maps each name to whether it is
    deterministic (observed by shadows, never probed)."""

    def __init__(self, proposers: Mapping[str, bool], config: ControllerConfig | None = None) -> None:
        self.config = config or ControllerConfig()
        self.deterministic = dict(proposers)
        self.pool: dict[str, AcceptanceCounts] = {}
        self.requests: dict[int, _Request] = {}

    # -- rates --------------------------------------------------------------------------

    def _prior(self, counts: AcceptanceCounts | None) -> tuple[tuple[float, float], float]:
        c = self.config
        return (c.prior_first, c.prior_later), c.prior_strength * c.memory ** (counts.rounds if counts else 0)

    def rates(self, key: int, proposer: str) -> tuple[float, float]:
        """``(e, q)`` of a request with a proposer: its own counts shrunk to the pool's rates,
        or to the config's guess before any."""
        counts = self._state(key).counts.get(proposer) or AcceptanceCounts()
        pool = self.pool.get(proposer)
        if pool is None:
            return counts.rates(*self._prior(counts))
        return counts.rates(pool.rates(*self._prior(pool)), self.config.pool_strength)

    def _state(self, key: int) -> _Request:
        state = self.requests.get(key)
        if state is None:
            state = self.requests[key] = _Request(interval=self.config.probe_every)
        return state

    # -- plan ---------------------------------------------------------------------------

    def plan(self, offers: Sequence[Offer], costs: RoundCosts) -> list[Spec]:
        """Every request's :class:`Spec` this round, in the order of ``offers``."""
        gains = [self._gains(o, costs) for o in offers]  # [R] {proposer: (G, ℓ)}
        paying = sum(any(g > 0 for g, _ in own.values()) for own in gains)  # requests whose drafts pay
        if costs.fixed_share > 0 and len(offers) > 1 and paying < len(offers):  # all paying: w = 1
            costs = drained(costs, paying / len(offers))
            gains = [self._gains(o, costs) for o in offers]
        blocked = {
            p for p, call_s in costs.call_s.items() if call_s > 0 and not self._call_pays(p, gains, costs)
        }
        specs = [self._decide(offer, own, blocked, costs) for offer, own in zip(offers, gains)]
        for p in blocked & {s.proposer for s in specs}:  # the call runs anyway: join it where it pays
            for i, (offer, own) in enumerate(zip(offers, gains)):
                g, ell = own.get(p, (-math.inf, 0))
                if specs[i].proposer is None and g > 0:
                    specs[i] = self._draft(offer.key, p, ell)
        return specs

    def _gains(self, offer: Offer, costs: RoundCosts) -> dict[str, tuple[float, int]]:
        out = {}
        for p, cap in offer.caps.items():
            if cap >= 1:
                e, q = self.rates(offer.key, p)
                d = costs.draft_s.get(p, 0.0)
                out[p] = best_length(
                    costs.value * e, q, cap, verify_s=costs.verify_s, rho=costs.rho, draft_s=d
                )
        return out

    @staticmethod
    def _call_pays(p: str, gains: list[dict], costs: RoundCosts) -> bool:
        """Rule 1: do the requests that would draft with ``p`` repay its per-call seconds?"""
        total = 0.0
        for own in gains:
            g = own.get(p, (-math.inf, 0))[0]
            if g > 0 and g >= max((v for n, (v, _) in own.items() if n != p), default=-math.inf):
                total += g
        return total > costs.rho * costs.call_s[p]

    def _decide(
        self,
        offer: Offer,
        own: dict[str, tuple[float, int]],
        blocked: set[str],
        costs: RoundCosts,
    ) -> Spec:
        state = self._state(offer.key)
        usable = {p: g for p, g in own.items() if p not in blocked}
        best = max(usable, key=lambda p: usable[p][0], default=None)
        if best is not None and usable[best][0] > 0 and not self.deterministic.get(best, False):
            return self._draft(offer.key, best, usable[best][1])
        state.skipped += 1  # rule 2: nothing probeable drafts this round
        due = [
            p
            for p in own
            if not self.deterministic.get(p, False)
            and state.skipped >= state.interval  # the clock first: the cost below is the dearer check
            and state.skipped >= self._probe_wait(offer, p, costs)
        ]
        if due:
            p = max(due, key=lambda n: own[n][0])
            state.skipped, state.interval = 0, min(2 * state.interval, self.config.probe_max)
            return Spec(p, min(offer.caps[p], self.config.probe_length), probe=True)
        if best is not None and usable[best][0] > 0:  # a deterministic proposer pays
            return Spec(best, usable[best][1])
        return Spec()  # plain decoding

    def _probe_wait(self, offer: Offer, p: str, costs: RoundCosts) -> float:
        """Rounds without drafting before a probe of ``p`` is due: the probe clock, and its cost
        spread over them at ``probe_budget`` of plain decoding's tokens."""
        e, q = self.rates(offer.key, p)
        draft_s = costs.draft_s.get(p, 0.0) + costs.call_s.get(p, 0.0)
        length = min(offer.caps[p], self.config.probe_length)
        cost = probe_cost(costs.value * e, q, length, verify_s=costs.verify_s, rho=costs.rho, draft_s=draft_s)
        return max(self._state(offer.key).interval, cost / self.config.probe_budget)

    def _draft(self, key: int, p: str, ell: int) -> Spec:
        """A drafting round verifying ``ℓ`` drafts; the probe clock starts again."""
        state = self._state(key)
        state.skipped, state.interval = 0, self.config.probe_every
        return Spec(p, ell)

    # -- observe ------------------------------------------------------------------------

    def observe(self, key: int, proposer: str, verified: int, accepted: int) -> None:
        """Request ``key`` verified ``verified`` drafts of ``proposer``, accepting ``accepted``."""
        if verified <= 0:
            return
        counts = self._state(key).counts.setdefault(proposer, AcceptanceCounts())
        counts.observe(verified, accepted, self.config.memory)
        self.pool.setdefault(proposer, AcceptanceCounts()).observe(
            verified, accepted, self.config.pool_memory
        )

    def forget(self, key: int) -> None:
        """A request finished."""
        self.requests.pop(key, None)


def drained(costs: RoundCosts, share: float) -> RoundCosts:
    """The round's costs while the batch drains, a ``share`` of its requests drafting: the batch
    takes as long as its last request, so a draft one request accepts saves its own part of a
    plain step, and the fixed part only when every request gains together:

        w = 1 − fixed_share·(1 − share)

    (1 when everybody drafts, ``c·R/(a + c·R)`` when one request alone would)."""
    return replace(costs, value=1.0 - costs.fixed_share * (1.0 - min(max(share, 0.0), 1.0)))
