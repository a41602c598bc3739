"""Per-request payoff control: draft only when it pays, with the proposer that pays most (SPEC §9, issue 17).

Each round, before anything is drafted, request r picks a proposer ``p`` (n-gram lookup,
the model drafter, or none = plain decoding) and a verification cap ``ℓ``, maximising the
predicted net gain

    G_r(p, ℓ) = E_{r,p}(ℓ) − ρ · (d_p + v(ℓ)),    E_{r,p}(ℓ) = e_{r,p} Σ_{k<ℓ} q_{r,p}^k

where ``e_{r,p}`` is the request's own rate of first-draft acceptance with that proposer
and ``q_{r,p}`` its rate of acceptance of a later draft given the previous one was
accepted (decayed counts, shrunk to a prior: the pooled rates of every request, or the
config's optimistic guess before any evidence, with pseudo-rounds that fade as the
request's own rounds come in), ``d_p`` the drafting seconds each request adds to its
proposer's call, ``v(ℓ)`` the target seconds that verifying ℓ more tokens of one request
adds to the step (``b·ℓ`` for the fitted step time ``t̂(R, e) = a + c·R + b·e`` of
``scheduler/step_times.py``, ``e`` the rows beyond one per request: separable, whatever the
others verify) and ``ρ`` the tokens per second plain decoding makes at this batch: the
right-hand side is what the same time would have produced without speculation. It drafts
iff the best ``G > 0``, verifying the best ℓ. A drafter call also costs seconds per call
that the requests drafting with it share; the batch drafts with that proposer only if
their gains together repay them (``shared_costs.shared_call_pays``), judged optimistically
(on the pooled rates' upper confidence bound, :func:`upper_rates`, while the evidence is
thin or has aged), so that a verdict drawn from a few unlucky rounds is tried again instead
of standing for good. A step in which anybody verifies pays a fixed part too (``j``: a
second attention group, verification's own fixed work); the round drafts only if the
requests drafting together repay it (``shared_costs.verification_pays``), and once anybody
verifies (a probe) every request whose drafting pays joins it.

When nothing pays, the request decodes plainly and *probes* every ``interval`` rounds
(a short verification with the most promising proposer; also while only the free n-gram
pays, so that a model drafter that would pay more is found), the interval doubling after
each probe that does not change the verdict, so a request whose text turns predictable
is picked up again at a bounded cost. A probe is priced too (:func:`probe_cost`: its
drafting, catch-up and verification seconds less the tokens it is expected to accept);
one costing ``c`` tokens waits at least ``c / probe_budget`` rounds, so that probes cost
at most that fraction of plain decoding, and a proposer that could not pay even if every
draft were accepted is not probed at all. A probe that may show a paying drafter is worth
more than its cost, though: its *value* (:func:`probe_value`, the value of the information
it brings) is what the request would gain, over the rounds it has left, by drafting after
the probe where the updated rates say it pays. A probe worth at least its cost is due with
the probe clock alone. A deterministic proposer (n-gram lookup) needs no
probes: its proposal made at some round is compared afterwards with the tokens the
request actually emitted (:func:`shadow_outcome`). Those tokens have the target's
distribution whatever produced them, so "the emitted token equals the proposed one"
happens with probability ``p_t(x)``, exactly the acceptance probability of a one-hot
draft: an unbiased, free observation of the n-gram's acceptance.

Lossless: every choice reads only the history (past outcomes, timings, and the n-gram's
proposal, itself a function of the history), never a draft it admits (the
non-anticipating rule of ``scheduler/policies.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class PayoffConfig:
    prior_first: float = 0.5  # e assumed before any evidence: optimistic, so every proposer is tried
    prior_later: float = 0.7  # q assumed before any evidence
    prior_strength: float = 2.0  # pseudo-rounds behind the config's priors (no evidence yet)
    # pseudo-rounds behind the pooled rates of every request (evidence): one miss of a request
    # then moves its own rates a little, where at 0.5 it stopped a converged drafter for 8 rounds
    pool_strength: float = 4.0
    memory: float = 0.9  # weight of the past per observed round (~10 rounds): texts change character
    probe_every: int = 8  # rounds of plain decoding before the first probe
    probe_max: int = 64  # the probe interval doubles up to this
    probe_length: int = 2  # drafts verified by a probe
    margin: float = 1.0  # draft only when the predicted gain beats its cost by this factor
    # probes may cost at most this fraction of plain decoding: one costing c tokens (probe_cost)
    # waits >= c / probe_budget rounds (the floor at 16-64 requests was 10-15 % of plain: issue 17)
    probe_budget: float = 0.02
    # ... unless what it may tell is worth more than it costs (probe_value): then it is due
    # with the probe clock alone. Off by default: on gsm8k at 16 / 64 requests it did not
    # lift the lock-in it was meant for (44 model rounds against the clock's ~200) and
    # measured no faster (mean 0.938× against 0.931×, ±0.09 noise; BENCHMARKS.md)
    value_probes: bool = False
    # The rates above are a request's own recent past: a request drafts when they are high,
    # and they regress to the mean (humaneval, 16 requests, tiny target: chosen model rounds
    # expected 2.3 accepted drafts and got 1.95). Each proposer's first-draft rate is scaled
    # by its realised/expected ratio over the rounds chosen to draft (:class:`Realism`),
    # with this many expected tokens of pseudo-evidence at ratio 1 (0: no scaling).
    realism_strength: float = 8.0
    realism_memory: float = 0.99  # per chosen round
    # Whether the requests' gains repay a shared drafter call is judged on the pooled rates'
    # upper confidence bound, this many standard errors up (:func:`upper_rates`; 0: the
    # means). Two unlucky early rounds (DFlash, gsm8k, 4 requests: 1.25 and 0 accepted against
    # 3-3.5 later) otherwise blocked the call for the rest of the answers although each
    # request's own gain was positive: nobody drafted, so nothing corrected the estimate.
    explore: float = 1.0
    # ... and while no request's outcome with a proposer comes in, its pooled evidence is
    # discounted by this factor a round (1: never): the bound widens again, so a blocked call
    # is retried in time (discounted UCB, for a bandit whose arms drift)
    pool_aging: float = 0.95
    # A model round verifies as far as pays with later drafts accepted at the upper bound of
    # the request's q (same z): q is learnt only where rounds verify (:func:`explored_length`)
    explore_lengths: bool = True
    # In a batch that drains (every request submitted at once, none left queued), the time
    # that counts is the last request's: a draft accepted by one request saves the fixed part
    # of a step only together with the others. An accepted draft is then valued at its row's
    # seconds plus the fixed part times the share of the batch whose drafts pay at 1/ρ
    # (``shared_costs.drain_value``); this share's memory per plan (0: 1/ρ's value always)
    drain_share_memory: float = 0.5

    def __post_init__(self) -> None:
        ok = 0 <= self.prior_first <= 1 and 0 <= self.prior_later <= 1 and 0 <= self.memory < 1
        ok = ok and self.prior_strength >= 0 and self.pool_strength >= 0 and self.probe_budget > 0
        ok = ok and self.realism_strength >= 0 and 0 <= self.realism_memory < 1 and self.explore >= 0
        ok = ok and 0 < self.pool_aging <= 1 and 0 <= self.drain_share_memory < 1
        if not (ok and self.probe_every >= 1 and self.probe_max >= self.probe_every and self.margin > 0):
            raise ValueError(f"bad payoff config {self}")


@dataclass(frozen=True, kw_only=True)
class RoundCosts:
    """Seconds a round costs at the current batch; see the module docstring."""

    verify_s: tuple[float, ...]  # v(ℓ), ℓ = 0..K: seconds verifying ℓ drafts per request adds
    tokens_per_s: float  # ρ: plain decoding's rate at this batch (all requests together)
    draft_s: Mapping[str, float]  # d_p: drafting seconds per request, per proposer
    # c: seconds one more plainly decoding request adds to a step (``StepTimes.step_model``);
    # None: ``verify_s[1]``, the price of a row whoever runs it
    request_s: float | None = None
    # j: seconds a step pays once when any request in it verifies (``StepTimes.step_model``),
    # shared by the requests drafting in it (:func:`~dspark.scheduler.shared_costs.verification_pays`)
    verify_call_s: float = 0.0


@dataclass
class AcceptanceRecord:
    """Decayed counts of one request's verified outcomes with one proposer."""

    first_tested: float = 0.0
    first_accepted: float = 0.0
    later_tested: float = 0.0
    later_accepted: float = 0.0
    rounds: int = 0  # observed rounds (undecayed): the prior fades as memory**rounds

    def observe(self, verified: int, accepted: int, memory: float) -> None:
        """A round that verified ``verified`` drafts and accepted the first ``accepted``."""
        if verified <= 0:
            return
        # Position k >= 2 is tested iff drafts 1..k-1 were accepted, accepted iff draft k is too.
        later_tested = max(0, min(accepted + 1, verified) - 1)
        later_accepted = max(0, accepted - 1)
        self.rounds += 1
        self.first_tested = memory * self.first_tested + 1.0
        self.first_accepted = memory * self.first_accepted + float(accepted > 0)
        if later_tested:
            w = memory**later_tested
            self.later_tested = w * self.later_tested + later_tested
            self.later_accepted = w * self.later_accepted + later_accepted

    def age(self, factor: float) -> None:
        """Discount the evidence (the rates stay; their confidence shrinks)."""
        self.first_tested *= factor
        self.first_accepted *= factor
        self.later_tested *= factor
        self.later_accepted *= factor

    def after_probe(self, accepted: bool, memory: float) -> AcceptanceRecord:
        """This record once a probe's first draft is verified: accepted, or not."""
        after = dataclasses.replace(self)
        after.observe(1, int(accepted), memory)
        return after

    def strength(self, config: PayoffConfig, *, pooled: bool) -> float:
        """Pseudo-rounds behind the prior :meth:`rates` shrinks to: the pooled rates', or the
        config's guess, fading as rounds are observed."""
        return config.pool_strength if pooled else config.prior_strength * config.memory**self.rounds

    def rates(self, config: PayoffConfig, prior: tuple[float, float] | None = None) -> tuple[float, float]:
        """``(e, q)``: first-draft and conditional later-draft acceptance, shrunk to ``prior``
        (the pooled rates, with ``pool_strength``; default: the config's priors)."""
        # The config's guess fades like observed rounds: evidence washes it out, so a proposer
        # that is never accepted tends to e = 0 instead of a floor set by the guess. The pooled
        # rates are evidence (they tend to 0 too if nobody is accepted) and keep their weight: at
        # c >= 4 a request's own ~10 decayed rounds are too few to price a block alone.
        s = self.strength(config, pooled=prior is not None)
        e0, q0 = prior if prior is not None else (config.prior_first, config.prior_later)
        e = (self.first_accepted + s * e0) / (self.first_tested + s)
        q = (self.later_accepted + s * q0) / (self.later_tested + s)
        return e, q


@dataclass
class Realism:
    """One proposer's accepted drafts against what the acceptance model expected of them, over
    the rounds it was chosen to draft (not probes, which are chosen where it looks poor).

    Choosing the rounds whose estimate is high selects estimates that are too high (the
    winner's curse); the decayed ratio ``f = (Σ accepted + s) / (Σ E + s)`` measures by how
    much, and the controller prices with ``e·f``. History only, so still lossless."""

    expected: float = 0.0
    accepted: float = 0.0

    def observe(self, expected: float, accepted: int, memory: float) -> None:
        self.expected = memory * self.expected + expected
        self.accepted = memory * self.accepted + accepted

    def factor(self, strength: float) -> float:
        if strength <= 0:
            return 1.0
        return (self.accepted + strength) / (self.expected + strength)


def upper_rates(pool: AcceptanceRecord, config: PayoffConfig) -> tuple[float, float]:
    """The pooled ``(e, q)`` priced optimistically: the upper end of each rate's Wilson score
    interval at ``z = config.explore``, with the decayed trials (plus the fading pseudo-rounds
    of the config's guess) as the sample size,

        u(p, n) = (p + z²/2n + z·sqrt(p(1 − p)/n + z²/4n²)) / (1 + z²/n)

    Optimism in the face of uncertainty, where a wrong "no" is never revisited: the pool's
    evidence grows only while somebody drafts with the proposer, so a shared call blocked on a
    pessimistic estimate from few rounds would stay blocked, where an optimistic verdict is
    tried and corrected (``u → p`` as ``n`` grows: ``POOL_MEMORY`` keeps ~100 rounds, ``z = 1``
    then adds ≤ 0.05). Only that verdict is optimistic: each request still drafts on its own
    estimate's mean, and pays its own seconds. History only, so lossless."""
    e, q = pool.rates(config)
    z = config.explore
    if z <= 0:
        return e, q
    s = pool.strength(config, pooled=False)  # as in AcceptanceRecord.rates
    return wilson_upper(e, pool.first_tested + s, z), wilson_upper(q, pool.later_tested + s, z)


def wilson_upper(p: float, n: float, z: float) -> float:
    """The upper end of the Wilson score interval of a rate ``p`` from ``n`` trials (1 without any)."""
    if n <= 0:
        return 1.0
    zz = z * z / n
    return min(1.0, (p + zz / 2 + z * math.sqrt(p * (1 - p) / n + zz / (4 * n))) / (1 + zz))


def explored_length(
    e: float, q: float, later_trials: float, cap: int, *, costs: RoundCosts, config: PayoffConfig
) -> int:
    """The verification length a drafting round takes: the best ``ℓ`` with later drafts accepted
    at the upper bound of ``q`` (:func:`wilson_upper` at ``z = config.explore`` over the
    request's ``later_trials``), drafting seconds left out (the block is drafted whatever ``ℓ``).

    ``q`` is learnt only at the positions a round verifies, so a request that priced short
    blocks from a few early misses kept verifying short blocks: on gsm8k with DFlash at 4
    requests the rates stayed near ``(0.56, 0.52)`` while rounds accepted 3-5.5 of 7 once the
    answer was under way (BENCHMARKS.md). Where the evidence is thin the bound is wide and
    the round verifies further; as it grows the bound tends to ``q``. The drafting decision
    stays on the means. History only, so lossless."""
    q_up = wilson_upper(q, later_trials, config.explore) if config.explore > 0 else q
    return best_length(e, q_up, cap, draft_s=0.0, costs=costs, margin=config.margin)[1]


def expected_accepted(e: float, q: float, length: int) -> float:
    """``E(ℓ) = e Σ_{k<ℓ} q^k``: expected accepted drafts when ``ℓ`` are verified."""
    return sum(e * q**k for k in range(max(length, 0)))


def best_length(
    e: float, q: float, cap: int, *, draft_s: float, costs: RoundCosts, margin: float = 1.0
) -> tuple[float, int]:
    """``(G, ℓ)``: the best net gain in tokens over ``ℓ = 1..cap`` (``(-inf, 0)`` when ``cap < 1``)."""
    cap = min(cap, len(costs.verify_s) - 1)
    if cap < 1:
        return float("-inf"), 0
    rho = costs.tokens_per_s
    gain, best, best_ell = 0.0, float("-inf"), 0
    for k in range(cap):
        gain += e * q**k / margin  # expected accepted drafts when verifying k + 1
        net = gain - rho * costs.verify_s[k + 1]
        if net > best:
            best, best_ell = net, k + 1
    return best - rho * draft_s, best_ell


def probe_cost(
    e: float,
    q: float,
    length: int,
    *,
    draft_s: float,
    call_s: float,
    costs: RoundCosts,
    margin: float = 1.0,
    step_s: float = 0.0,
) -> float:
    """Tokens a probe verifying ``length`` drafts is expected to cost one request, net of the
    drafts it is expected to accept (``>= 0``): ``ρ·(d + c + s + v(ℓ)) − E(ℓ)`` with the per-call
    seconds ``c`` charged whole, and ``s = step_s`` the step's fixed part of verification where
    the probe pays it alone. ``inf`` when drafting could not pay even with every draft
    accepted (``max_ℓ ℓ/margin − ρ·(v(ℓ) + d + c) <= 0``): no outcome of a probe would change
    the verdict (``s`` left out there: a batch drafting together shares it)."""
    rho, K = costs.tokens_per_s, len(costs.verify_s) - 1
    overhead = rho * (draft_s + call_s)
    perfect = max((ell / margin - rho * costs.verify_s[ell] for ell in range(1, K + 1)), default=0.0)
    length = min(length, K)
    if perfect - overhead <= 0 or length < 1:
        return float("inf")
    accepted = 0.0
    for k in range(length):  # E(ℓ) / margin, summed as best_length (and payoff_batch) sum it
        accepted += e * q**k / margin
    net = accepted - rho * costs.verify_s[length] - overhead
    return max(0.0, rho * step_s - net)


def probe_value(e: float, gain_if_accepted: float, gain_if_missed: float, horizon: float) -> float:
    """Tokens a probe is expected to win by what it tells (its value of information).

    After the probe the request drafts iff its updated gain is positive, over the
    ``horizon`` rounds it has left; plain decoding, the verdict without the probe, gains 0
    over them. The probe's first draft is accepted with probability ``e`` (the request's
    rate now), giving the gain ``G⁺`` per round, else ``G⁻``:

        V = H · (e · max(G⁺, 0) + (1 − e) · max(G⁻, 0))

    One outcome stands for what drafting would then show, so this undervalues a probe
    whose verdict later rounds would confirm. What the outcome tells the other requests
    through the pooled rates is :func:`~dspark.scheduler.payoff_batch.pooled_probe_value`.
    """
    return horizon * (e * max(gain_if_accepted, 0.0) + (1.0 - e) * max(gain_if_missed, 0.0))


def probe_due_after(cost: float, value: float | None, interval: int, config: PayoffConfig) -> float:
    """Skipped rounds after which a probe costing ``cost`` tokens and worth ``value`` is due:
    the probe clock's ``interval``, and also :func:`probe_wait` unless the value repays it."""
    if value is not None and config.value_probes and value >= cost:
        return interval
    return max(interval, probe_wait(cost, config))


@dataclass(frozen=True)
class Choice:
    """This round's decision for one request: ``proposer`` None = decode plainly."""

    proposer: str | None
    length: int = 0  # verification cap ℓ
    probe: bool = False


PLAIN = Choice(None)


@dataclass
class PayoffController:
    """One request's payoff state: an acceptance record per proposer and the probe clock."""

    config: PayoffConfig = field(default_factory=PayoffConfig)
    records: dict[str, AcceptanceRecord] = field(default_factory=dict)
    # (proposer, e, q) this round drafts with, as priced before :class:`Realism` scaling
    expecting: tuple[str, float, float] | None = None
    skipped: int = 0  # consecutive rounds without drafting
    interval: int = 0  # rounds between probes now (0 = config.probe_every)

    def record(self, proposer: str) -> AcceptanceRecord:
        return self.records.setdefault(proposer, AcceptanceRecord())

    def gains(
        self,
        caps: Mapping[str, int],
        costs: RoundCosts,
        priors: Mapping[str, tuple[float, float]] | None = None,
        scales: Mapping[str, float] | None = None,
    ) -> dict[str, tuple[float, int]]:
        """``{proposer: (G, ℓ)}`` for every proposer that can propose (``caps[p] >= 1``);
        ``scales``: :meth:`Realism.factor` per proposer (missing: 1)."""
        out = {}
        for name, cap in caps.items():
            if cap >= 1:
                e, q = self.record(name).rates(self.config, (priors or {}).get(name))
                e = min(1.0, e * (scales or {}).get(name, 1.0))
                out[name] = best_length(
                    e, q, cap, draft_s=costs.draft_s.get(name, 0.0), costs=costs, margin=self.config.margin
                )
        return out

    def decide(
        self,
        caps: Mapping[str, int],
        costs: RoundCosts,
        *,
        shadowed: Sequence[str] = (),
        priors: Mapping[str, tuple[float, float]] | None = None,
        blocked: Sequence[str] = (),
        gains: Mapping[str, tuple[float, int]] | None = None,
        probe_costs: Mapping[str, float] | None = None,
        probe_values: Mapping[str, float] | None = None,
        scales: Mapping[str, float] | None = None,
    ) -> Choice:
        """This round's proposer and cap. ``caps``: most drafts each proposer can offer now;
        ``shadowed``: proposers observed for free (:func:`shadow_outcome`), never probed;
        ``priors``: ``(e, q)`` per proposer that the request's own rates shrink to (the
        pooled rates of every request, so a new request starts from what others saw);
        ``blocked``: proposers that may only be probed this round (their shared per-call
        cost is not repaid by the batch, ``shared_costs.shared_call_pays``); ``gains``: what
        :meth:`gains` returns for these arguments, when the caller has it already;
        ``probe_costs``: :func:`probe_cost` per proposer (missing: 0, the probe clock alone);
        ``probe_values``: :func:`probe_value` per proposer (missing: the cost decides alone);
        ``scales``: as :meth:`gains`."""
        gains = self.gains(caps, costs, priors, scales) if gains is None else gains
        probeable = {n: g for n, g in gains.items() if n not in shadowed}
        usable = {n: g for n, g in gains.items() if n not in blocked}
        best = max(usable, key=lambda n: usable[n][0]) if usable else None
        if best is not None and usable[best][0] > 0 and best in probeable:
            return self.drafts(best, gains[best][1])
        # Nothing probeable drafts this round (plain decoding, or a shadowed proposer that pays):
        # the probeable ones are probed now and then, so a stale verdict on them is revisited.
        self.skipped += 1
        interval = self.interval or self.config.probe_every
        due = {
            n: g
            for n, g in probeable.items()
            if self.skipped
            >= probe_due_after(
                (probe_costs or {}).get(n, 0.0), (probe_values or {}).get(n), interval, self.config
            )
        }
        if due:
            self.skipped = 0
            self.interval = min(2 * interval, self.config.probe_max)
            name = max(due, key=lambda n: due[n][0])
            return Choice(name, min(caps[name], self.config.probe_length), probe=True)
        if best is not None and usable[best][0] > 0:
            return Choice(best, usable[best][1])
        return Choice(None)

    def drafts(self, proposer: str, length: int) -> Choice:
        """Draft for real with ``proposer`` this round: no probe is due before the next skipped rounds."""
        self.skipped, self.interval = 0, self.config.probe_every
        return Choice(proposer, length)

    def observe(self, proposer: str, verified: int, accepted: int) -> None:
        self.record(proposer).observe(verified, accepted, self.config.memory)


def probe_wait(cost: float, config: PayoffConfig) -> float:
    """Skipped rounds before a probe costing ``cost`` tokens is due: its cost spread over them
    is ``probe_budget`` of the tokens plain decoding makes meanwhile (``inf``: never)."""
    return cost / config.probe_budget


def shadow_outcome(proposal: Sequence[int], emitted: Sequence[int]) -> tuple[int, int] | None:
    """What verifying a deterministic ``proposal`` would have given, from the tokens the
    request ``emitted`` since it was made: ``(verified, accepted)``, or None while the
    emitted tokens match it so far and do not yet cover it."""
    matched = 0
    for drafted, actual in zip(proposal, emitted):
        if drafted != actual:
            return len(proposal), matched
        matched += 1
    return (len(proposal), matched) if matched == len(proposal) else None


def start_shadows(
    decoding: Sequence, choices: Sequence[Choice], lookups: Mapping[int, list[int]], name: str
) -> None:
    """Start each request's shadow evaluation (:func:`shadow_outcome`) of the deterministic
    proposer ``name`` from this round's lookup (checked against what the request emits),
    unless that proposer drafts for it for real this round."""
    for req, choice in zip(decoding, choices):
        if choice.proposer == name:
            req.shadow = None  # this round observes it for real
        elif req.shadow is None and lookups.get(req.id):
            req.shadow = (len(req.generated), lookups[req.id])
