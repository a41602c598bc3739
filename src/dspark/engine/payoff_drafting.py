"""The engine side of payoff control: which proposer drafts for which request this round (issue 17).

The decision itself is :class:`~dspark.scheduler.payoff.PayoffController` (pure, per request);
this module feeds it the round's costs (SPS table, measured drafting seconds per proposer),
runs the n-gram lookup for every decoding request (free information: it bounds what the
n-gram can propose now and is the proposal its shadow evaluation checks later), calls each
chosen proposer once for the requests that chose it, and merges the parts into one
:class:`~dspark.protocols.DraftBlock` in the order of the drafting requests. One proposer per
request per round: each row of the merged block is exactly what one proposer would have
drafted alone, so verification keeps the target's distribution.

Costs are measured where the engine runs, all on one clock (:func:`pricing_clock`): step
times are the engine's own forwards fitted affine in rows over the SPS profile
(:class:`~dspark.scheduler.step_times.StepTimes`); the model drafter's seconds are fitted
as a per-call part the round's drafting requests share plus a per-request part
(:class:`~dspark.scheduler.step_times.DraftCosts`) — leaving out calls that hold a request's
first model proposal, which also pays the drafter's pass over the whole prompt, once per
request; the n-gram lookup is an average per request. A drafter that catches up
from ``state.features`` (``sync_context``, on itself or its backbone) is told only about
its own rounds, and a request drafting with it is also charged the absorption of the
tokens it has not seen (timed apart before the call, fitted per call + per token).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping

import torch

from dspark.drafters.ngram import NgramConfig, NgramDrafter
from dspark.drafters.request_state import sync_requests
from dspark.engine.merged_block import merge_blocks
from dspark.engine.payoff_plan import MODEL, NGRAM, POOL_MEMORY, SMALL_BATCH, plan_batch, plan_each
from dspark.protocols import DraftBlock, Drafter, draft_rows_per_request, drafts_after_prompt
from dspark.scheduler import SpsTable
from dspark.scheduler.payoff import (
    PLAIN,
    AcceptanceRecord,
    Choice,
    PayoffConfig,
    PayoffController,
    Realism,
    RoundCosts,
    expected_accepted,
    shadow_outcome,
    start_shadows,
    upper_rates,
)
from dspark.scheduler.shared_costs import drain_value
from dspark.scheduler.step_times import DecayedLine, DraftCosts, StepTimes, fit_line

# A catch-up (the whole prompt on a request's first model proposal, the skipped rounds on a
# return) is paid once for the rounds that follow: each round that would pay it is charged
# its share over this many of the request's next rounds (fewer near its end). Charged whole,
# it kept requests on which drafting paid from ever drafting (gsm8k, 16 requests: 16 model
# rounds at 0.97x plain where the probe clock's forced tries drafted 196 at 1.10x).
CATCH_UP_ROUNDS = 8
SHADOW_EVERY = 4  # tokens between n-gram lookups while the n-gram does not pay

UPDATE = "model-update"  # the model drafter's state update after a round it drafted


def pricing_clock(device: torch.device | str, threads: int | None = None) -> Callable[[], float]:
    """The clock costs are measured on. A CPU target on one thread runs every forward in the
    engine's thread: that thread's CPU time (``time.thread_time``) is what the engine
    spends, and unlike wall time it does not count the time other processes of a shared
    machine hold the core (on a 3x oversubscribed machine, wall-clock steps swing 2x
    between neighbours). With several threads (whose waits may sleep) or on an
    accelerator, wall time."""
    threads = torch.get_num_threads() if threads is None else threads
    if torch.device(device).type == "cpu" and threads == 1:
        return time.thread_time
    return time.perf_counter


class PayoffDrafting:
    """Per-round proposer choice for an engine. ``draft_costs`` fixes d_p instead of measuring
    it and prices steps with ``sps`` as is (no observed step times): a timing for tests."""

    def __init__(
        self,
        drafter: Drafter,
        vocab_size: int,
        block_size: int,
        sps: SpsTable,
        *,
        choose_proposer: bool = True,
        config: PayoffConfig | None = None,
        draft_costs: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        is_ngram = isinstance(drafter, NgramDrafter)
        self.model = None if is_ngram else drafter
        # the model drafts in a request's first round too (protocols.drafts_after_prompt)
        self.model_after_prompt = self.model is None or drafts_after_prompt(self.model)
        if is_ngram:
            self.ngram: NgramDrafter | None = drafter
        elif choose_proposer:
            self.ngram = NgramDrafter(vocab_size, NgramConfig(block_size=max(block_size, 1)))
        else:
            self.ngram = None
        self.vocab_size, self.block_size, self.sps = vocab_size, block_size, sps
        self.config = config or PayoffConfig()
        self.fixed_costs = dict(draft_costs) if draft_costs is not None else None
        self.clock = clock  # every cost below is in its seconds
        self.draft_s: dict[str, float] = {}  # EMAs per request: n-gram lookup, model update
        self.model_costs = DraftCosts()  # the model drafter's seconds: per call + per request
        # ... of calls that held some request's first model proposal with its pass over the
        # whole prompt (a drafter that does not catch up apart, ``sync_context``): an
        # overestimate, priced with only until a call without one was timed. At 64 requests
        # almost every early call holds a newcomer, and pricing the model at 0 s meanwhile
        # made it draft where it lost a third of plain decoding's speed (issue 17).
        self.first_costs = DraftCosts()
        self.model_step_s = 0.0  # the model drafter's seconds in this engine step
        self.model_rows = draft_rows_per_request(drafter, block_size)  # per request, per forward
        self._split: tuple = (None, (0.0, 0.0))  # (inputs, model_split) of the last call
        # A lazily updated drafter absorbs, when a request next drafts, every token committed
        # since: (tokens absorbed, seconds) per request, fitted as a line (``catch_up_s``).
        self.sync_line = DecayedLine(0.98)
        self.step_times = StepTimes(sps)
        # A drafter that catches up from ``state.features`` when it proposes (``sync_context``,
        # on itself or its backbone: DFlash, DSpark) is told only about its own rounds.
        sync_net = (
            self.model if hasattr(self.model, "sync_context") else getattr(self.model, "backbone", None)
        )
        self.sync_net = sync_net if hasattr(sync_net, "sync_context") else None
        self.lazy_update = self.sync_net is not None
        # Every request's outcomes pooled per proposer, slowly forgotten: the prior a request's
        # own rates shrink to (a new request starts from what the others saw, not from 0.5).
        self.pooled: dict[str, AcceptanceRecord] = {}
        self.realism: dict[str, Realism] = {}  # per proposer, over the rounds chosen to draft
        self._observed: set[str] = set()  # proposers whose outcomes came in since the last plan
        # (request ids, K, rounds left) while the last plan holds (``QUIET_REPLAN``)
        self._quiet: tuple[tuple[int, ...], int, int] | None = None
        self.planned = self.reused = 0  # rounds priced in full / by the last quiet plan
        self.small_batch = SMALL_BATCH  # batches up to this size are priced request by request
        # Set by the engine each step: every request was submitted at once and none waits for a
        # slot, so the batch takes as long as its last request (``Engine.generate``)
        self.draining = False
        # share of the batch whose drafts would pay at 1/ρ's value, lately (decayed per plan)
        self.paying_share = 1.0

    def round_config(self, costs: RoundCosts, num_requests: int) -> PayoffConfig:
        """The config a round priced with ``costs`` uses: :attr:`config`, with the ``margin``
        raised by :func:`~dspark.scheduler.shared_costs.drain_value` at :attr:`paying_share` while
        the batch drains (an accepted draft is worth ``1/ρ`` only if the batch drafts together)."""
        if not (self.draining and self.config.drain_share_memory > 0):
            return self.config
        b = costs.request_s  # the plain step a + b·R priced with
        if b is None:
            b = costs.verify_s[1] if len(costs.verify_s) > 1 else 0.0
        a = max(max(num_requests, 1) / max(costs.tokens_per_s, 1e-12) - b * num_requests, 0.0)
        w = drain_value(a, b, num_requests, self.paying_share)
        return (
            self.config
            if w >= 1.0 - 1e-12
            else dataclasses.replace(self.config, margin=self.config.margin / w)
        )

    def observe_share(self, paying: float) -> None:
        """Decay :attr:`paying_share` towards this round's share of requests whose drafts would
        pay at ``1/ρ`` (whatever the round was priced at: no lock-in on its own verdict)."""
        m = self.config.drain_share_memory
        self.paying_share = m * self.paying_share + (1.0 - m) * paying

    def controller(self) -> PayoffController:
        return PayoffController(config=self.config)

    def costs(self, num_requests: int) -> RoundCosts:
        R = max(num_requests, 1)
        if self.fixed_costs is not None:
            draft_s = self.fixed_costs
        else:
            draft_s = dict(self.draft_s)
            if self.model_line.observed:
                draft_s[MODEL] = self.model_split(R)[1] + self.draft_s.get(UPDATE, 0.0)
        verify_s, rho = self.step_times.prices(R, self.block_size)
        if not self.step_times.line.w:  # the profile's prices: no step seen yet
            return RoundCosts(verify_s=verify_s, tokens_per_s=rho, draft_s=draft_s)
        step = self.step_times.step_model(R, self.block_size)
        return RoundCosts(
            verify_s=verify_s, tokens_per_s=rho, draft_s=draft_s, request_s=step.c, verify_call_s=step.j
        )

    def model_split(self, num_requests: int) -> tuple[float, float]:
        """The model drafter's ``(seconds per call, seconds per request)``; while its calls
        were all of one size, split like the target's step line over the rows a request adds
        to a drafter forward (``K + 1``, or 1 for a chain drafter: ``draft_rows_per_request``)."""
        R = max(num_requests, 1)
        line = self.model_line
        key = (R, self.step_times.line.w, self.step_times.line.wy, id(line), line.line.wy)
        if self._split[0] != key:  # asked twice a round (costs, then the shared-call check)
            a, b = self.step_times.fit(R, R * (self.block_size + 1))  # the sizes a round's steps take
            self._split = (key, line.split((a, b * self.model_rows)))
        return self._split[1]

    @property
    def model_line(self) -> DraftCosts:
        """The model drafter's seconds to price with: its calls without a first proposal once
        one was timed, else those with one."""
        return self.model_costs if self.model_costs.observed else self.first_costs

    def pending(self, req) -> int:
        """Committed tokens the model drafter has not absorbed for ``req`` (0 unless lazy)."""
        if not self.lazy_update:
            return 0
        cache = req.state.drafter_cache
        done = cache.context.length if cache is not None else 0
        return max(len(req.state.token_ids) - 1 - done, 0)

    def catch_up_s(self, req) -> float:
        """Seconds drafting with the model now adds for ``req`` to absorb its pending tokens
        (the whole context on its first proposal, the rounds it skipped later)."""
        return float(self.catch_up_batch([req])[0])

    def model_call_s(self, num_requests: int) -> float:
        """The model drafter's seconds per call, shared by the requests drafting with it."""
        if self.fixed_costs is not None or not self.model_line.observed:
            return 0.0
        return self.model_split(num_requests)[0]

    def observe_step(self, num_tokens: int, seconds: float, num_requests: int | None = None) -> None:
        """An engine step without prefill rows, over ``num_tokens`` decode/verification rows of
        ``num_requests`` requests (default: one row each), took ``seconds`` (on :attr:`clock`):
        all of it but the model drafter's calls and updates (priced as drafting) is what a step
        of that shape costs — the forward, and also the sampling, verification and
        bookkeeping around it."""
        seconds -= self.model_step_s
        self.model_step_s = 0.0
        if self.fixed_costs is None:
            self.step_times.observe(num_tokens, seconds, num_requests)

    def start_step(self) -> None:
        self.model_step_s = 0.0

    def observe_update(self, req, seconds: float) -> None:
        """The model drafter's state update after ``req``'s round took ``seconds``: a cost of
        drafting with it when only its own rounds update it (``sync_context``)."""
        if self.lazy_update and req.proposer == MODEL:  # else every round pays it: a step cost
            self.model_step_s += seconds
            if self.fixed_costs is None:
                self._measured(UPDATE, seconds, 1)

    def _measured(self, name: str, seconds: float, count: int) -> None:
        if count:
            per = seconds / count
            prev = self.draft_s.get(name)
            self.draft_s[name] = per if prev is None else 0.9 * prev + 0.1 * per

    def plan(self, decoding: list, K: int) -> tuple[list[Choice], dict[int, list[int]]]:
        """Every decoding request's choice this round, and the n-gram lookups (request id -> tokens):
        :meth:`PayoffController.decide`'s decisions request by request (``engine/payoff_plan.py``)."""
        self.age_pool()
        quiet, self._quiet = self._quiet, None
        if quiet is not None and quiet[:2] == (tuple(r.id for r in decoding), K):
            return self._quiet_round(decoding, K, quiet[2])
        self.planned += 1
        if len(decoding) <= self.small_batch and not self.config.value_probes:
            return plan_each(self, decoding, K)
        return plan_batch(self, decoding, K)

    def age_pool(self) -> None:
        """A new round: discount the pooled evidence of each proposer whose outcomes did not
        come in since the last (``PayoffConfig.pool_aging``; a quiet plan reused for a few
        rounds prices with the priors it was made with)."""
        for name, record in self.pooled.items():
            if name not in self._observed:
                record.age(self.config.pool_aging)
        self._observed.clear()

    @property
    def proposers(self) -> list[str]:
        """The proposers a request may choose from (besides plain decoding)."""
        return [name for name, p in ((NGRAM, self.ngram), (MODEL, self.model)) if p is not None]

    def priors(self) -> dict[str, tuple[float, float]]:
        """The pooled ``(e, q)`` per proposer that each request's own rates shrink to."""
        return {name: record.rates(self.config) for name, record in self.pooled.items()}

    def bound(self, proposer: str) -> tuple[float, float] | None:
        """The pooled rates' upper confidence bound (:func:`~dspark.scheduler.payoff.upper_rates`),
        what a shared call's cost is checked against (``shared_call_pays`` in ``engine/payoff_plan.py``)."""
        pool = self.pooled.get(proposer)
        return upper_rates(pool, self.config) if pool is not None else None

    def scales(self) -> dict[str, float]:
        """:meth:`Realism.factor` per proposer: the first-draft rates are priced times this."""
        return {name: r.factor(self.config.realism_strength) for name, r in self.realism.items()}

    def _quiet_round(self, decoding: list, K: int, rounds: int) -> tuple[list[Choice], dict[int, list[int]]]:
        """A round under the last plan (every request plain, no probe due): count the skipped
        round and run only the n-gram lookups due for the shadow evidence — as :meth:`plan`
        would decide while the gains and costs it priced hold."""
        self.reused += 1
        lookups: dict[int, list[int]] = {}
        if self.ngram is not None:  # the reused plan found the n-gram hopeless for every request
            budget = [min(K, max(r.draft_budget, 0)) for r in decoding]
            lookups = self._lookups(decoding, budget, [True] * len(decoding))
        for req in decoding:
            req.payoff.skipped += 1
        choices = [PLAIN] * len(decoding)
        start_shadows(decoding, choices, lookups, NGRAM)
        if rounds > 1:
            self._quiet = (tuple(r.id for r in decoding), K, rounds - 1)
        return choices, lookups

    def _lookups(self, decoding: list, budget: list[int], hopeless: list[bool]) -> dict[int, list[int]]:
        """Each request's n-gram lookup of up to its budget (request id -> tokens). While even a
        whole block would not pay (``hopeless``), only every ``SHADOW_EVERY`` tokens, to refresh
        the shadow evidence: a lookup per request per step is not free."""
        lo, hi, started = self.ngram.config.min_n, self.ngram.config.max_n, self.clock()
        lookups = {}
        for req, n, lost in zip(decoding, budget, hopeless):
            due = req.shadow is None and len(req.generated) % SHADOW_EVERY == 0
            skip = n == 0 or (lost and not due)
            lookups[req.id] = [] if skip else req.positions.lookup(req.state.token_ids, n, lo, hi)
        self._measured(NGRAM, self.clock() - started, len(decoding))
        return lookups

    def catch_up_charge(self, decoding: list) -> list[float]:
        """``[R]``: the seconds of each request's catch-up (:meth:`catch_up_batch`) charged to this
        round: its share over the next ``CATCH_UP_ROUNDS`` rounds, or over the rounds the request
        has left (at most two tokens a round) if fewer."""
        rounds = [min(max(math.ceil(max(r.draft_budget + 1, 1) / 2), 1), CATCH_UP_ROUNDS) for r in decoding]
        return [seconds / n for seconds, n in zip(self.catch_up_batch(decoding), rounds)]

    def catch_up_batch(self, decoding: list) -> list[float]:
        """:meth:`catch_up_s` of every request, ``[R]``: the fitted absorption line at each one's
        pending tokens, 0 where none are pending. (Python floats: at a few requests numpy's
        per-call cost was most of a plan's.)"""
        if not self.sync_line.w or self.fixed_costs is not None:
            return [0.0] * len(decoding)
        a, b = fit_line(self.sync_line)
        return [a + b * n if (n := self.pending(r)) > 0 else 0.0 for r in decoding]

    def propose(
        self,
        decoding: list,
        choices: list[Choice],
        lookups: dict[int, list[int]],
        K: int,
        fill_confidences: Callable[[torch.Tensor], torch.Tensor],
    ) -> tuple[DraftBlock, list, dict[int, int]]:
        """One merged block over the drafting requests: ``(block, drafting requests, caps by id)``.

        ``fill_confidences`` maps peaks ``[n, K]`` to confidences ``[n, K]`` for the n-gram
        rows when the model reports its own.
        """
        by_model = [r for r, c in zip(decoding, choices) if c.proposer == MODEL]
        by_ngram = [r for r, c in zip(decoding, choices) if c.proposer == NGRAM]
        caps = {r.id: c.length for r, c in zip(decoding, choices) if c.proposer is not None}
        parts: list[tuple[list, DraftBlock]] = []
        if by_model:
            for req in by_model:  # rows of rounds it was not told about (``FeatureBuffer.defer``)
                req.sync_features()
            if self.lazy_update:  # absorb the pending tokens first, timed apart (``catch_up_s``)
                for req in by_model:
                    if n := self.pending(req):
                        started = self.clock()
                        # makes a first proposal's cache too, so its whole-prompt pass lands here
                        sync_requests(self.sync_net, [req.state], [req.params])
                        elapsed = self.clock() - started
                        self.model_step_s += elapsed
                        if self.fixed_costs is None:
                            self.sync_line.observe(float(n), elapsed)
            started = self.clock()
            # Always γ drafts, capped per request: a seeded request draws the same drafter randomness.
            parts.append(
                (by_model, self.model.propose([r.state for r in by_model], K, [r.params for r in by_model]))
            )
            elapsed = self.clock() - started
            self.model_step_s += elapsed
            if self.fixed_costs is None:  # calls with a first (whole-prompt) proposal apart
                clean = self.lazy_update or all(r.payoff.record(MODEL).first_tested > 0 for r in by_model)
                (self.model_costs if clean else self.first_costs).observe(len(by_model), elapsed)
        if by_ngram:
            tokens = torch.zeros(len(by_ngram), K, dtype=torch.long)  # [n, K]
            lengths = torch.zeros(len(by_ngram), dtype=torch.long)  # [n]
            for i, req in enumerate(by_ngram):
                found = lookups[req.id][:K]
                tokens[i, : len(found)] = torch.tensor(found, dtype=torch.long)
                lengths[i] = len(found)
            parts.append((by_ngram, DraftBlock(tokens=tokens, lengths=lengths, probs=None)))  # one-hot
        return (
            merge_blocks(parts, K, self.vocab_size, fill_confidences),
            [r for rs, _ in parts for r in rs],
            caps,
        )

    def needs_update(self, req) -> bool:
        """Tell the model drafter about this round now? A drafter that catches up from
        ``state.features`` when it next proposes (``sync_context``) is told only after its own
        rounds, so rounds it did not draft cost it nothing."""
        return req.proposer == MODEL or not self.lazy_update

    def observe(self, req, verified: int, accepted: int, proposer: str | None) -> None:
        if proposer is None or verified <= 0:
            return
        if proposer == MODEL and len(req.rounds) == 1:
            # an answer's first tokens, learnt apart if at all (prompt_end_anchors: 0.5-0.9 of 7
            # against 2-3.6 later, tiny target): pooled, they locked the model out (BENCHMARKS.md)
            req.payoff.expecting = None
            return
        self._observe(req, proposer, verified, accepted)

    def _observe(self, req, proposer: str, verified: int, accepted: int) -> None:
        expecting, req.payoff.expecting = req.payoff.expecting, None
        if expecting is not None and expecting[0] == proposer:  # a round chosen to draft
            E = expected_accepted(expecting[1], expecting[2], verified)
            self.realism.setdefault(proposer, Realism()).observe(E, accepted, self.config.realism_memory)
        req.payoff.observe(proposer, verified, accepted)
        self.pooled.setdefault(proposer, AcceptanceRecord()).observe(verified, accepted, POOL_MEMORY)
        self._observed.add(proposer)

    def after_commit(self, req) -> None:
        """Resolve the request's pending n-gram shadow proposal against the tokens it emitted."""
        if req.shadow is None:
            return
        start, proposal = req.shadow
        outcome = shadow_outcome(proposal, req.generated[start:])
        if outcome is not None:
            self._observe(req, NGRAM, *outcome)
            req.shadow = None
