"""Stage 2 of an engine step (``engine/engine.py``): plan and draft, then schedule (DESIGN §9, §10).

Under the speculation controller each request drafts with the proposer that pays most now,
or not at all (``engine/speculation.py``); without it every request drafts. The policy then
turns confidences into verification lengths ``ℓ_r`` within each request's cap, all known
before drafting (``scheduler/policies.py``); a request whose drafts are not distributions
fails alone. Lossless: no choice reads the draft it admits.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from dspark.engine.config import EngineConfig, EngineStats
from dspark.engine.requests import Finish, Request
from dspark.engine.speculation import MODEL, NGRAM, Speculation
from dspark.protocols import DraftBlock, Drafter, drafter_traits
from dspark.scheduler import ConfidenceEstimator, Policy, SpsTable, schedule, stale_history

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Drafts:
    """A step's drafts: ``block`` rows of the drafting requests (``rows``: request id -> row),
    and ``lengths [R]``, the drafts each decoding request verifies (0: plain decoding)."""

    block: DraftBlock
    rows: dict[int, int]
    lengths: Tensor

    @staticmethod
    def none(num_requests: int, vocab_size: int) -> Drafts:
        return Drafts(DraftBlock.empty(0, vocab_size), {}, torch.zeros(num_requests, dtype=torch.long))

    def of(self, i: int, req: Request) -> list[int]:
        """The drafts request ``req`` (``i``-th decoding request) verifies this step."""
        n = int(self.lengths[i])
        return self.block.tokens[self.rows[req.id], :n].tolist() if n else []


class DraftStage:
    """The engine's drafting and scheduling, over the engine's own (shared) collaborators;
    ``finish`` is the engine's way to end a request (one whose drafts are corrupt)."""

    def __init__(
        self,
        *,
        drafter: Drafter | None,
        config: EngineConfig,
        policy: Policy,
        sps: SpsTable | None,
        estimator: ConfidenceEstimator,
        speculation: Speculation | None,
        vocab_size: int,
        finish: Finish,
    ) -> None:
        self.drafter, self.config, self.policy, self.sps = drafter, config, policy, sps
        self.estimator, self.speculation, self.vocab_size = estimator, speculation, vocab_size
        self._finish = finish
        self._after_prompt = drafter is None or drafter_traits(drafter).after_prompt

    def __call__(
        self, decoding: list[Request], base_tokens: int, step_index: int, stats: EngineStats
    ) -> Drafts:
        """Draft for the decoding requests and schedule their verification lengths."""
        K = self.config.block_size
        if self.drafter is None or K == 0 or not decoding:
            return Drafts.none(len(decoding), self.vocab_size)
        started = time.perf_counter()
        if self.speculation is not None:
            specs = self.speculation.plan(decoding, K)
            stats.planned_rounds += len(specs)
            stats.plain_rounds += sum(s.proposer is None for s in specs)
            stats.ngram_rounds += sum(s.proposer == NGRAM for s in specs)
            stats.model_rounds += sum(s.proposer == MODEL for s in specs)
            stats.model_probes += sum(s.probe for s in specs)
            block, chosen, caps = self.speculation.propose(decoding, specs, K, self.estimator.predict)
        else:
            chosen = [r for r in decoding if r.draft_budget > 0 and (r.generated or self._after_prompt)]
            # Always γ drafts, capped per request by the scheduler: a seeded request then draws
            # the same drafter randomness alone or in any batch.
            block = DraftBlock.empty(0, self.vocab_size)
            if chosen:
                block = self.drafter.propose([r.state for r in chosen], K, [r.params for r in chosen])
            caps = {r.id: K for r in chosen}
        stats.draft_s += time.perf_counter() - started
        if not chosen:
            return Drafts.none(len(decoding), self.vocab_size)
        block, chosen = self._drop_non_finite(block, chosen)
        decoding = [r for r in decoding if r.finish_reason is None]  # as the engine filters them
        if not chosen:
            return Drafts.none(len(decoding), self.vocab_size)
        stats.drafted += int(block.lengths.sum())
        rows = {r.id: i for i, r in enumerate(chosen)}
        lengths = self._schedule(decoding, block, rows, caps, base_tokens, step_index)
        return Drafts(block, rows, lengths)

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

    def _schedule(
        self,
        decoding: list[Request],
        block: DraftBlock,
        rows: dict[int, int],
        caps: dict[int, int],
        base_tokens: int,
        step_index: int,
    ) -> Tensor:
        """Verification lengths ``[R]`` over the decoding requests (0 for those not drafting);
        ``step_index`` is the engine's never-reset step count (prefix-async's stale confidences)."""
        R, K = len(decoding), block.max_len
        index = torch.tensor(
            [rows.get(r.id, -1) for r in decoding], dtype=torch.long
        )  # [R], -1 = not drafting
        has = index >= 0
        budget = torch.tensor(
            [min(max(r.draft_budget, 0), caps.get(r.id, 0)) for r in decoding], dtype=torch.long
        )
        limits = torch.zeros(R, dtype=torch.long)
        limits[has] = torch.minimum(block.lengths.cpu()[index[has]], budget[has].clamp(max=K))
        if not self.policy.needs_confidences:
            return schedule(self.policy, limits)
        conf = block.confidences
        if conf is None:  # no confidence head: the online estimator's, from the draft distributions
            conf = self.estimator.predict(block.peaks())
        confidences = torch.zeros(R, K, dtype=torch.float64)
        confidences[has] = conf.detach().double().cpu()[index[has]]
        for i, req in enumerate(decoding):
            if req.id in rows:
                req.confidence_history.append((step_index, confidences[i].clone()))
        stale = stale_caps = None
        if self.policy.rule.reads_history:
            prior = self.estimator.position_rates()[:K].double()
            histories = [r.confidence_history for r in decoding]
            stale = stale_history(histories, step_index, self.policy.lag, prior, K)  # [R, K], none from now
            stale_caps = torch.where(has, budget.clamp(max=K), 0)  # known before drafting
        return schedule(
            self.policy,
            limits,
            confidences,
            sps=self.sps,
            base_tokens=base_tokens,
            stale_confidences=stale,
            stale_caps=stale_caps,
        )
