"""The batched speculative-decoding engine: continuous batching with a scheduler (SPEC §10).

One :meth:`Engine.step`:

1. **admit** queued requests into free KV slots (the preallocated memory is the limit);
2. **prefill**: pick prompt chunks of prefilling requests, up to ``prefill_chunk``
   tokens per step (chunked prefill, mixed with the decode runs below);
3. **draft** for every decoding request, except those the difficulty-aware early exit
   skips (their own history says the first draft would likely be rejected) and, under
   the SPS-driven policies, those whose expected accepted tokens would not repay the
   drafting and verification time (cost-aware drafting, ``scheduler/drafting.py``); with
   ``EngineConfig.payoff`` instead, each request drafts with the proposer (n-gram lookup
   or the model) its own history says pays most now, or not at all
   (``scheduler/payoff.py``, ``engine/payoff_drafting.py``);
4. **schedule**: the policy turns confidences (the drafter's, or the online estimator's)
   into per-request verification lengths ``ℓ_r`` (``scheduler/policies.py``);
5. **one target forward** over the flattened runs — each decoding request's anchor and
   ``ℓ_r`` drafts, each prefill chunk (``targets/flat.py``);
6. **verify** by rejection sampling (``sampling/rejection.py``), per-request RNGs;
7. **commit / roll back** each request's KV to anchor + accepted drafts, cut at EOS /
   ``max_tokens`` / stop strings (``decoding/stopping.py``), stream the tokens, free the
   slots of finished requests.

Lossless: every choice made before verification — early exit, caps, ``ℓ_r`` — is a
function of the history and of drafts before the one it admits, never of the draft it
admits (``scheduler/policies.py``), so each request's output has the target's
distribution whatever the batch. With a batch-independent policy (``fixed``,
``fixed:k``, ``threshold:t`` on drafter confidences) a seeded request gives the same
tokens alone or in any batch.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from dspark.decoding.stopping import cut_round
from dspark.engine.config import DEFAULT_MAX_SEQ_LEN, EngineConfig, EngineStats
from dspark.engine.kv import KVMemory
from dspark.engine.payoff_drafting import PayoffDrafting
from dspark.engine.profile import load_or_profile
from dspark.engine.requests import OnTokens, Request, RequestFailedError, TokenEvent
from dspark.errors import DsparkError, PromptTooLongError
from dspark.protocols import DraftBlock, Drafter, GenerationResult, RoundLog, SamplingParams, SequenceState
from dspark.sampling import batch_probs, verify
from dspark.scheduler import (
    ConfidenceEstimator,
    FirstAcceptPredictor,
    SpsTable,
    drafting_pays,
    marginal_token_s,
    parse_policy,
    peak_features,
    schedule,
    stale_history,
)
from dspark.targets import TargetAdapter
from dspark.targets.flat import KVStore, Run, flat_forward

logger = logging.getLogger(__name__)


class Engine:
    """Continuous-batching speculative decoding over one target and one drafter.

    ``submit`` enqueues a request and returns its id; ``step`` runs one engine step and
    returns the tokens it emitted; ``generate`` runs a list of prompts to completion.
    ``drafter=None`` decodes plainly (one token per request per step) on the same path.
    """

    def __init__(
        self,
        target: TargetAdapter,
        drafter: Drafter | None = None,
        config: EngineConfig | None = None,
        *,
        sps: SpsTable | None = None,
        decode: Callable[[list[int]], str] | None = None,
    ) -> None:
        config = config or EngineConfig()
        self.target, self.drafter, self.config = target, drafter, config
        self.policy = parse_policy(config.policy)
        capacity = min(config.max_seq_len or DEFAULT_MAX_SEQ_LEN, target.max_context)
        store = KVStore.for_target(target, num_slots=config.max_batch, capacity=capacity)
        logger.info(
            "KV memory: %d slots x %d tokens = %.1f MB", config.max_batch, capacity, store.nbytes / 2**20
        )
        self.kv = KVMemory(store)
        if sps is None and (self.policy.needs_sps or config.payoff) and drafter is not None:
            sps = load_or_profile(target, store, block_size=config.block_size, path=config.sps_path)
        self.sps = sps
        if decode is None and target.tokenizer is not None:
            tok = target.tokenizer
            decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
        self.decode = decode
        self.estimator = ConfidenceEstimator(max(config.block_size, 1))
        self.stats = EngineStats()
        # The drafter's feature layers go to every forward as an argument (checked to exist here).
        self._layer_ids = target.feature_layers(drafter.target_layer_ids) if drafter is not None else ()
        self._needs_features = len(self._layer_ids) > 0
        self._queue: deque[Request] = deque()
        self._active: list[Request] = []  # requests holding a KV slot, in admission order
        self._finished: dict[int, Request] = {}
        self._next_id = 0
        self._step_index = 0  # never reset (stats may be), for prefix-async's stale confidences
        self._draft_s_per_request: float | None = None  # EMA of drafting seconds per drafted request
        self._told_unprofitable = False  # logged once that cost-aware drafting stopped drafting
        self.payoff = None  # per-request proposer choice (engine/payoff_drafting.py)
        self._payoff_caps: dict[int, int] = {}  # this step's ℓ per drafting request
        if config.payoff and drafter is not None:
            self.payoff = PayoffDrafting(
                drafter,
                target.vocab_size,
                config.block_size,
                self.sps,
                choose_proposer=config.choose_proposer,
                draft_costs=dict(config.draft_costs) if config.draft_costs is not None else None,
            )

    # -- public API ---------------------------------------------------------------------

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, on_tokens: OnTokens | None = None
    ) -> int:
        """Queue a request; returns its id. ``on_tokens`` is called with each step's new tokens."""
        prompt_ids = list(prompt_ids)
        if not prompt_ids:
            raise DsparkError("the prompt is empty")
        if len(prompt_ids) + 1 > self.kv.capacity:
            raise PromptTooLongError(
                f"prompt has {len(prompt_ids)} tokens; the engine's context is {self.kv.capacity}"
            )
        if params.stop and self.decode is None:
            raise ValueError("stop strings need a decode function (or a target with a tokenizer)")
        rid, self._next_id = self._next_id, self._next_id + 1
        self._queue.append(
            Request(
                id=rid,
                params=params,
                state=SequenceState(rid, prompt_ids, len(prompt_ids)),
                max_new=min(params.max_tokens, self.kv.capacity - len(prompt_ids)),
                generator=torch.Generator().manual_seed(params.seed) if params.seed is not None else None,
                on_tokens=on_tokens,
                predictor=FirstAcceptPredictor(estimate=self.estimator.config.prior),
                payoff=self.payoff.controller() if self.payoff is not None else None,
            )
        )
        return rid

    def cancel(self, request_id: int) -> None:
        """Stop a queued or running request and free its KV slot (e.g. a client disconnect)."""
        for req in [*self._queue, *self._active]:
            if req.id == request_id:
                if req in self._queue:
                    self._queue.remove(req)
                self._finish(req, "cancelled", None)
                return

    def has_work(self) -> bool:
        return bool(self._queue or self._active)

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    @property
    def num_active(self) -> int:
        return len(self._active)

    def result(self, request_id: int) -> GenerationResult:
        """The outcome of a finished request (it stays available until ``pop_result``)."""
        return self._finished[request_id].result()

    def pop_result(self, request_id: int) -> GenerationResult:
        return self._finished.pop(request_id).result()

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[GenerationResult]:
        """Run ``prompts`` to completion as one continuous batch; results in prompt order."""
        params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        ids = [self.submit(p, sp) for p, sp in zip(prompts, params, strict=True)]
        while self.has_work():
            self.step()
        results = [self.pop_result(i) for i in ids]
        failed = next((r for r in results if r.finish_reason == "error"), None)
        if failed is not None:
            raise RequestFailedError(failed.error)
        return results

    # -- one step -----------------------------------------------------------------------

    @torch.no_grad()
    def step(self) -> list[TokenEvent]:
        """Admit, prefill, draft, schedule, verify, commit; returns the emitted tokens."""
        started = time.perf_counter()
        while self._queue and self.kv.num_free:
            req = self._queue.popleft()
            self.kv.allocate(req.id)
            self._active.append(req)
        decoding = [r for r in self._active if self._uncached(r) == 0]
        prefill = self._plan_prefill()
        if not decoding and not prefill:
            return []
        block, drafting = self._draft(decoding)
        failed = [TokenEvent(r.id, [], "error") for r in decoding if r.finish_reason == "error"]
        if failed:
            decoding = [r for r in decoding if r.finish_reason is None]
            if not decoding and not prefill:
                return failed
        lengths = self._schedule(decoding, block, drafting, sum(n for _, n in prefill))

        runs, ids, offsets = [], [], []
        for req, n in zip(decoding, lengths.tolist()):
            offsets.append(len(ids))  # where the request's anchor sits in the flat batch
            drafts = block.tokens[drafting[req.id], :n].tolist() if n else []
            ids += [req.state.token_ids[-1], *drafts]
            runs.append(Run(self.kv.slot(req.id), self.kv.length(req.id), 1 + n))
        num_decode_rows = len(ids)
        for req, n in prefill:
            start = self.kv.length(req.id)
            ids += req.state.token_ids[start : start + n]
            runs.append(Run(self.kv.slot(req.id), start, n))
        forward_started = time.perf_counter()
        out = flat_forward(
            self.target,
            self.kv.store,
            torch.tensor(ids),
            runs,
            logits_at=torch.arange(num_decode_rows),
            with_features=self._needs_features,
            layer_ids=self._layer_ids,
        )
        # A drafter fed other layers than it reads would silently lose its acceptance.
        assert not self._needs_features or out.layer_ids == self._layer_ids, (out.layer_ids, self._layer_ids)
        forward_s = time.perf_counter() - forward_started
        self.stats.forward_s += forward_s
        if self.payoff is not None and not prefill:  # the step times payoff control prices with
            self.payoff.observe_step(len(ids), forward_s)

        prefill_offset = num_decode_rows
        for req, n in prefill:
            if out.features is not None:
                req.state.features = req.features.append(out.features[prefill_offset : prefill_offset + n])
            self.kv.set_length(req.id, self.kv.length(req.id) + n)
            prefill_offset += n
        events = failed + self._verify_and_commit(decoding, block, drafting, lengths, out, offsets)

        self._step_index += 1
        s = self.stats
        s.steps += 1
        s.prefill_tokens += sum(n for _, n in prefill)
        s.forward_tokens += len(ids)
        s.max_forward_tokens = max(s.max_forward_tokens, len(ids))
        s.step_s += time.perf_counter() - started
        return events

    # -- the stages ---------------------------------------------------------------------

    def _uncached(self, req: Request) -> int:
        """Prompt tokens still to prefill: everything but the anchor must be cached to decode."""
        return len(req.state.token_ids) - 1 - self.kv.length(req.id)

    def _plan_prefill(self) -> list[tuple[Request, int]]:
        budget, plan = self.config.prefill_chunk, []
        for req in self._active:
            n = min(self._uncached(req), budget)
            if n > 0:
                plan.append((req, n))
                budget -= n
            if budget == 0:
                break
        return plan

    def _drafting_pays(self, decoding: list[Request]) -> list[bool]:
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
        self._report_cost_decision(pays)
        return pays

    def _report_cost_decision(self, pays: list[bool]) -> None:
        """Count the cost-aware decisions, and log when drafting first stops paying for everyone."""
        unprofitable = pays.count(False)
        self.stats.cost_checked += len(pays)
        self.stats.cost_unprofitable += unprofitable
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

    def _draft(self, decoding: list[Request]) -> tuple[DraftBlock, dict[int, int]]:
        """Propose for the requests that draft this step; ``drafting`` maps request id -> block row."""
        K = self.config.block_size
        if self.payoff is not None and K > 0:
            return self._payoff_draft(decoding, K)
        pays = self._drafting_pays(decoding)
        chosen = [
            r
            for r, worth in zip(decoding, pays)
            if self.drafter is not None
            and r.draft_budget > 0
            and r.predictor.should_draft(
                self.config.early_exit,
                self.config.probe_every,
                pays=worth,
                probe_unprofitable=self.config.probe_unprofitable,
            )
        ]
        if not chosen or K == 0:
            return DraftBlock.empty(0, self.target.vocab_size), {}
        started = time.perf_counter()
        # Always γ drafts, capped per request by the scheduler: a seeded request then draws
        # the same drafter randomness alone or in any batch.
        block = self.drafter.propose([r.state for r in chosen], K, [r.params for r in chosen])
        elapsed = time.perf_counter() - started
        self.stats.draft_s += elapsed
        per_request = elapsed / len(chosen)
        prev = self._draft_s_per_request
        self._draft_s_per_request = per_request if prev is None else 0.9 * prev + 0.1 * per_request
        block, chosen = self._drop_non_finite(block, chosen)
        self.stats.drafted += int(block.lengths.sum())
        return block, {r.id: i for i, r in enumerate(chosen)}

    def _payoff_draft(self, decoding: list[Request], K: int) -> tuple[DraftBlock, dict[int, int]]:
        """Payoff control: each request drafts with the proposer that pays, or not at all."""
        started = time.perf_counter()
        choices, lookups = self.payoff.plan(decoding, K)
        for req, choice in zip(decoding, choices):
            req.proposer = choice.proposer
        self.stats.cost_checked += len(choices)
        self.stats.cost_unprofitable += sum(c.proposer is None for c in choices)
        self.stats.ngram_rounds += sum(c.proposer == "ngram" for c in choices)
        self.stats.model_rounds += sum(c.proposer == "model" for c in choices)
        peaks = lambda probs: self.estimator.predict(peak_features(probs))  # noqa: E731
        block, chosen, caps = self.payoff.propose(decoding, choices, lookups, K, peaks)
        self.stats.draft_s += time.perf_counter() - started
        if not chosen:
            return DraftBlock.empty(0, self.target.vocab_size), {}
        block, chosen = self._drop_non_finite(block, chosen)
        self._payoff_caps = caps
        self.stats.drafted += int(block.lengths.sum())
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

    def _schedule(
        self, decoding: list[Request], block: DraftBlock, drafting: dict[int, int], base_tokens: int
    ) -> Tensor:
        """Verification lengths ``[R]`` over all decoding requests (non-drafting ones get 0)."""
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
            conf = self.estimator.predict(peak_features(block.probs))
        confidences = torch.zeros(R, K, dtype=torch.float64)
        confidences[has] = conf.detach().double().cpu()[rows[has]]
        step = self._step_index
        for i, req in enumerate(decoding):
            if req.id in drafting:
                req.confidence_history.append((step, confidences[i].clone()))
        stale = stale_caps = None
        if self.policy.rule.reads_history:
            prior = self.estimator.position_rates()[:K].double()
            histories = [r.confidence_history for r in decoding]
            stale = stale_history(histories, step, self.policy.lag, prior, K)  # [R, K], none from now
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

    def _verify_and_commit(
        self,
        decoding: list[Request],
        block: DraftBlock,
        drafting: dict[int, int],
        lengths: Tensor,
        out,
        offsets: list[int],
    ) -> list[TokenEvent]:
        R = len(decoding)
        if R == 0:
            return []
        L = int(lengths.max())
        device = out.logits.device
        # Row t of request r: its anchor's flat row + t (rows past ℓ_r repeat the last, unused).
        rows = torch.tensor(offsets).unsqueeze(-1) + torch.minimum(torch.arange(L + 1), lengths.unsqueeze(-1))
        rows = rows.to(device)  # [R, L+1]
        params = [r.params for r in decoding]
        target_probs = batch_probs(out.logits[rows], params)  # [R, L+1, V]
        tokens = torch.zeros(R, L, dtype=torch.long, device=device)  # [R, L]
        draft_probs = None
        n_verified = lengths.tolist()
        greedy = [p.greedy for p in params]
        if L > 0:
            # greedy verification compares tokens only: no [R, L, V] copy of the draft probs
            if not all(greedy):
                draft_probs = target_probs.new_zeros(R, L, target_probs.shape[-1])  # [R, L, V]
            for i, (req, n) in enumerate(zip(decoding, n_verified)):
                if n > 0:
                    j = drafting[req.id]
                    tokens[i, :n] = block.tokens[j, :n].to(device)
                    if draft_probs is not None:
                        draft_probs[i, :n] = block.probs[j, :n].to(draft_probs)
        result = verify(
            tokens,
            lengths.to(device),
            draft_probs,
            target_probs,
            greedy=torch.tensor(greedy, device=device),
            generators=[r.generator for r in decoding],
        )
        n_accepted = result.num_accepted.tolist()
        self._observe(decoding, block, drafting, n_verified, n_accepted)
        events, finished = [], []
        eos = self.target.eos_token_ids
        drafted, next_tokens = tokens.tolist(), result.next_tokens.tolist()
        for i, (req, n, accepted) in enumerate(zip(decoding, n_verified, n_accepted)):
            start = self.kv.length(req.id)
            self.kv.set_length(req.id, start + 1 + accepted)  # anchor + accepted drafts; the rest rolls back
            new_features = None
            if out.features is not None:
                new_features = out.features[offsets[i] : offsets[i] + 1 + accepted]  # [a+1, L, H]
                req.state.features = req.features.append(new_features)
            emitted = drafted[i][:accepted] + [next_tokens[i]]  # accepted drafts + recovered/bonus
            cut = cut_round(req.generated, emitted, eos, req.max_new, req.params.stop, self.decode)
            req.generated += cut.tokens
            req.state.token_ids += cut.tokens
            req.rounds.append(RoundLog(proposed=n, accepted=accepted, emitted=len(cut.tokens)))
            if self.payoff is not None:
                self.payoff.observe(req, n, accepted, req.proposer if req.id in drafting else None)
                self.payoff.after_commit(req)
            self.stats.emitted += len(cut.tokens)
            events.append(TokenEvent(req.id, cut.tokens, cut.finish_reason))
            if req.on_tokens is not None and cut.tokens:
                req.on_tokens(cut.tokens)
            if cut.finish_reason is not None:
                finished.append((req, cut))
            elif self.drafter is not None and (self.payoff is None or self.payoff.needs_update(req)):
                update_started = time.perf_counter()
                self.drafter.update(req.state, accepted, new_features)
                self.stats.update_s += time.perf_counter() - update_started
        # Free slots only now: a release moves another request's slot, whose committed
        # length must already include this step's tokens.
        for req, cut in finished:
            self._finish(req, cut.finish_reason, cut.text)
        return events

    def _observe(
        self,
        decoding: list[Request],
        block: DraftBlock,
        drafting: dict[int, int],
        verified: list[int],
        accepted: list[int],
    ) -> None:
        """Feed the round's outcomes to the early-exit predictors and the confidence estimator."""
        s = self.stats
        s.rounds += len(decoding)
        s.verified += sum(verified)
        s.accepted += sum(accepted)
        for req, n, a in zip(decoding, verified, accepted):
            if n > 0:
                req.predictor.observe(a > 0)
        if drafting and block.probs is not None and block.max_len > 0:
            idx = [i for i, r in enumerate(decoding) if r.id in drafting]
            rows = torch.tensor([drafting[decoding[i].id] for i in idx])
            self.estimator.observe(
                peak_features(block.probs[rows]),
                torch.tensor([verified[i] for i in idx]),
                torch.tensor([accepted[i] for i in idx]),
            )

    def _finish(self, req: Request, reason: str, text: str | None) -> None:
        req.finish_reason, req.finished_at = reason, time.perf_counter()
        req.text = text if text is not None else (self.decode(req.generated) if self.decode else "")
        if req.id in self.kv:
            self.kv.release(req.id)
        if req in self._active:
            self._active.remove(req)
        self._finished[req.id] = req
