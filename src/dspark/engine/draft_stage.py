"""Stages 3 and 4 of :meth:`Engine.step`: who drafts, with what, and how many drafts each verifies.

**Draft**: every decoding request drafts, except those the difficulty-aware early exit
skips and, under the SPS-driven policies, those whose expected accepted tokens would not
repay the drafting and verification time (cost-aware drafting, ``scheduler/drafting.py``);
with ``EngineConfig.payoff`` instead, each request drafts with the proposer its own
history says pays most now, or not at all (``engine/payoff_drafting.py``). A request
whose drafts are not distributions is failed alone.

**Schedule**: the policy turns confidences (the drafter's, or the online estimator's)
into per-request verification lengths ``ℓ_r`` (``scheduler/policies.py``).

Lossless: each choice here reads the history and drafts before the one it admits, never
the draft it admits (``scheduler/policies.py``).
"""

from __future__ import annotations

import logging
import time

import torch
from torch import Tensor

from dspark.engine.config import EngineConfig, EngineStats
from dspark.engine.payoff_drafting import PayoffDrafting
from dspark.engine.requests import Finish, Request
from dspark.protocols import DraftBlock, Drafter, drafts_after_prompt
from dspark.scheduler import (
    ConfidenceEstimator,
    Policy,
    SpsTable,
    drafting_pays,
    marginal_token_s,
    schedule,
    stale_history,
)

logger = logging.getLogger(__name__)


class DraftStage:
    """The engine's drafting and scheduling, with the state they keep across steps.

    The collaborators are the engine's own (shared, never copied); ``finish`` is the
    engine's way to end a request, used to fail one whose drafts are corrupt. Counters go
    to the ``stats`` passed to each call, so that a caller may swap the engine's stats.
    """

    def __init__(
        self,
        *,
        drafter: Drafter | None,
        config: EngineConfig,
        policy: Policy,
        sps: SpsTable | None,
        estimator: ConfidenceEstimator,
        payoff: PayoffDrafting | None,
        vocab_size: int,
        finish: Finish,
    ) -> None:
        self.drafter, self.config, self.policy, self.sps = drafter, config, policy, sps
        self.estimator, self.payoff, self.vocab_size, self._finish = estimator, payoff, vocab_size, finish
        self._draft_s_per_request: float | None = None  # EMA of drafting seconds per drafted request
        self._told_unprofitable = False  # logged once that cost-aware drafting stopped drafting
        self._payoff_caps: dict[int, int] = {}  # this step's ℓ per drafting request
        # whether the drafter is asked in a request's first round too (protocols.drafts_after_prompt)
        self._after_prompt = drafter is None or drafts_after_prompt(drafter)

    # -- draft --------------------------------------------------------------------------

    def _drafting_pays(self, decoding: list[Request], stats: EngineStats) -> list[bool]:
        """Cost-aware drafting (``scheduler/drafting.py``) for the SPS-driven policies; else all True."""
        R = len(decoding)
        ready = self.sps is not None and self._draft_s_per_request is not None
        if not (self.config.cost_aware and self.policy.needs_sps and ready):
            return [True] * R
        K = max(self.config.block_size, 1)
        first = torch.tensor([r.predictor.estimate for r in decoding], dtype=torch.float64)
        pays = drafting_pays(
            first,
            self.estimator.position_rates()[1:K],
            draft_s=self._draft_s_per_request,
            token_s=marginal_token_s(self.sps, R, R),  # about one more verified token per request
            tokens_per_s=R * self.sps(R),
        ).tolist()
        self._report_cost_decision(pays, stats)
        return pays

    def _report_cost_decision(self, pays: list[bool], stats: EngineStats) -> None:
        """Count the cost-aware decisions, and log when drafting first stops paying for everyone."""
        unprofitable = pays.count(False)
        stats.cost_checked += len(pays)
        stats.cost_unprofitable += unprofitable
        if pays and unprofitable == len(pays) and not self._told_unprofitable:
            self._told_unprofitable = True
            logger.warning(
                "cost-aware drafting: at %d running request(s), drafting (%.1f ms per request) is "
                "predicted to cost more time than its accepted tokens save, so requests decode "
                "plainly and re-probe the drafter every %d rounds (dspark_engine_cost_unprofitable "
                "in /metrics counts these rounds; --no-cost-aware drafts always)",
                len(pays),
                1e3 * (self._draft_s_per_request or 0.0),
                self.config.probe_unprofitable,
            )

    def draft(self, decoding: list[Request], stats: EngineStats) -> tuple[DraftBlock, dict[int, int]]:
        """Propose for the requests that draft this step; ``drafting`` maps request id -> block row."""
        K = self.config.block_size
        if self.payoff is not None and K > 0:
            return self._payoff_draft(decoding, K, stats)
        pays = self._drafting_pays(decoding, stats)
        chosen = [
            r
            for r, worth in zip(decoding, pays)
            if self.drafter is not None
            and r.draft_budget > 0
            and (r.generated or self._after_prompt)
            and r.predictor.should_draft(
                self.config.early_exit,
                self.config.probe_every,
                pays=worth,
                probe_unprofitable=self.config.probe_unprofitable,
            )
        ]
        if not chosen or K == 0:
            return DraftBlock.empty(0, self.vocab_size), {}
        started = time.perf_counter()
        # Always γ drafts, capped per request by the scheduler: a seeded request then draws
        # the same drafter randomness alone or in any batch.
        block = self.drafter.propose([r.state for r in chosen], K, [r.params for r in chosen])
        elapsed = time.perf_counter() - started
        stats.draft_s += elapsed
        per_request = elapsed / len(chosen)
        prev = self._draft_s_per_request
        self._draft_s_per_request = per_request if prev is None else 0.9 * prev + 0.1 * per_request
        block, chosen = self._drop_non_finite(block, chosen)
        stats.drafted += int(block.lengths.sum())
        return block, {r.id: i for i, r in enumerate(chosen)}

    def _payoff_draft(
        self, decoding: list[Request], K: int, stats: EngineStats
    ) -> tuple[DraftBlock, dict[int, int]]:
        """Payoff control: each request drafts with the proposer that pays, or not at all."""
        started, reused = time.perf_counter(), self.payoff.reused
        choices, lookups = self.payoff.plan(decoding, K)
        stats.quiet_plans += self.payoff.reused - reused
        for req, choice in zip(decoding, choices):
            req.proposer = choice.proposer
        stats.cost_checked += len(choices)
        stats.cost_unprofitable += sum(c.proposer is None for c in choices)
        stats.ngram_rounds += sum(c.proposer == "ngram" for c in choices)
        stats.model_rounds += sum(c.proposer == "model" for c in choices)
        stats.model_probes += sum(c.probe for c in choices)
        block, chosen, caps = self.payoff.propose(decoding, choices, lookups, K, self.estimator.predict)
        stats.draft_s += time.perf_counter() - started
        if not chosen:
            return DraftBlock.empty(0, self.vocab_size), {}
        block, chosen = self._drop_non_finite(block, chosen)
        self._payoff_caps = caps
        stats.drafted += int(block.lengths.sum())
        return block, {r.id: i for i, r in enumerate(chosen)}

    def _drop_non_finite(self, block: DraftBlock, chosen: list[Request]) -> tuple[DraftBlock, list[Request]]:
        """Fail the requests whose drafts are not distributions (a corrupt drafter: NaN/inf).

        Sampling from them is undefined, and their confidences would poison the shared
        estimator; every other request of the batch goes on.
        """
        bad = block.invalid_rows()  # [R]
        if not bool(bad.any()):
            return block, chosen
        for req in (r for r, b in zip(chosen, bad.tolist()) if b):
            logger.warning("request %d: the drafter produced non-finite probabilities; failing it", req.id)
            req.error = (
                "the drafter produced non-finite probabilities for this request (corrupt drafter weights?); "
                "the request was stopped"
            )
            self._finish(req, "error", None)
        keep = torch.nonzero(~bad).squeeze(-1)  # [R'] rows that stay
        rows = keep.to(block.tokens.device)
        pick = lambda t: None if t is None else t[rows.to(t.device)]  # noqa: E731
        kept = DraftBlock(pick(block.tokens), pick(block.lengths), pick(block.probs), pick(block.confidences))
        return kept, [chosen[i] for i in keep.tolist()]

    # -- schedule -----------------------------------------------------------------------

    def schedule(
        self,
        decoding: list[Request],
        block: DraftBlock,
        drafting: dict[int, int],
        base_tokens: int,
        step_index: int,
    ) -> Tensor:
        """Verification lengths ``[R]`` over all decoding requests (non-drafting ones get 0).

        ``step_index`` is the engine's never-reset step count (prefix-async's stale confidences).
        """
        R, K = len(decoding), block.max_len
        if not drafting:
            return torch.zeros(R, dtype=torch.long)
        rows = torch.tensor([drafting.get(r.id, -1) for r in decoding])  # [R], -1 = not drafting
        has = rows >= 0
        budget = torch.tensor([max(r.draft_budget, 0) for r in decoding]).clamp(max=K)  # [R]
        caps = torch.zeros(R, dtype=torch.long)
        caps[has] = torch.minimum(block.lengths.cpu()[rows[has]], budget[has])
        if self.payoff is not None:  # the controller's ℓ, chosen from history before drafting
            chosen = torch.tensor([self._payoff_caps.get(r.id, 0) for r in decoding])
            caps = torch.minimum(caps, chosen)
        if not self.policy.needs_confidences:
            return schedule(self.policy, caps)
        conf = block.confidences
        if conf is None:  # no confidence head: the online estimator's, from the draft distributions
            conf = self.estimator.predict(block.peaks())
        confidences = torch.zeros(R, K, dtype=torch.float64)
        confidences[has] = conf.detach().double().cpu()[rows[has]]
        for i, req in enumerate(decoding):
            if req.id in drafting:
                req.confidence_history.append((step_index, confidences[i].clone()))
        stale = stale_caps = None
        if self.policy.rule.reads_history:
            prior = self.estimator.position_rates()[:K].double()
            histories = [r.confidence_history for r in decoding]
            stale = stale_history(histories, step_index, self.policy.lag, prior, K)  # [R, K], none from now
            stale_caps = torch.where(has, budget, 0)  # known before drafting
        return schedule(
            self.policy,
            caps,
            confidences,
            sps=self.sps,
            base_tokens=base_tokens,
            stale_confidences=stale,
            stale_caps=stale_caps,
        )
