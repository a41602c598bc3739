"""The batched speculative-decoding engine: continuous batching with a controller (DESIGN §10).

One :meth:`Engine.step` is a pipeline of stages over named data:

1. **admit** queued requests into free KV slots (the preallocated memory is the limit), and
   pick prompt chunks to **prefill**, up to ``prefill_chunk`` tokens per step, mixed with
   the decode runs below;
2. **plan and draft** (:class:`~dspark.engine.draft_stage.DraftStage` → ``Drafts``): the
   speculation controller picks per request a proposer or none (``engine/speculation.py``),
   each proposer drafts for its requests, and the policy turns confidences into
   verification lengths ``ℓ_r`` (``scheduler/policies.py``);
3. **forward** (:meth:`Engine._forward` → ``FlatOutput``): one target forward over the
   flattened runs, each decoding request's anchor and ``ℓ_r`` drafts, each prefill chunk;
4. **verify, commit, observe** (:class:`~dspark.engine.verify_stage.VerifyStage` →
   ``TokenEvent``): rejection sampling with per-request RNGs, the KV rolled back to anchor +
   accepted drafts, stop rules, streamed tokens, and the outcomes back to the controller.

Lossless: every choice made before verification (the proposer, the caps, ``ℓ_r``) is a
function of the history and of drafts before the one it admits, never of the draft it
admits, so each request's output has the target's distribution whatever the batch.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

import torch

from dspark.engine.config import DEFAULT_MAX_SEQ_LEN, EngineConfig, EngineStats
from dspark.engine.draft_stage import Drafts, DraftStage
from dspark.engine.kv import KVMemory
from dspark.engine.profile import load_or_profile, pricing_clock
from dspark.engine.requests import OnTokens, Request, RequestFailedError, TokenEvent
from dspark.engine.speculation import Speculation
from dspark.engine.verify_stage import VerifyStage
from dspark.errors import DsparkError, PromptTooLongError
from dspark.protocols import Drafter, GenerationResult, SamplingParams, SequenceState
from dspark.scheduler import ConfidenceEstimator, SpsTable, parse_policy
from dspark.targets import TargetAdapter
from dspark.targets.flat import FlatOutput, KVStore, Run, flat_forward

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
        self.speculation = None  # the speculation controller's engine side (engine/speculation.py)
        if config.payoff and drafter is not None:
            self.speculation = Speculation(
                drafter,
                target.vocab_size,
                config.block_size,
                self.sps,
                choose_proposer=config.choose_proposer,
                draft_costs=dict(config.draft_costs) if config.draft_costs is not None else None,
                clock=pricing_clock(target.device),
                waiting=lambda: len(self._queue),
            )
        self._drafts = DraftStage(
            drafter=drafter,
            config=config,
            policy=self.policy,
            sps=self.sps,
            estimator=self.estimator,
            speculation=self.speculation,
            vocab_size=target.vocab_size,
            finish=self._finish,
        )
        self._verify = VerifyStage(
            target=target,
            kv=self.kv,
            drafter=drafter,
            estimator=self.estimator,
            speculation=self.speculation,
            decode=decode,
            finish=self._finish,
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
        """Admit, prefill, draft, schedule, verify, commit; returns the emitted tokens.

        No request can kill the engine: a step that raises is replayed one request at a
        time, and a request whose step raises alone is failed (``finish_reason`` "error")
        while every other one goes on (:meth:`_replay_alone`).
        """
        started = time.perf_counter()
        spec = self.speculation
        priced_started = spec.start_step() if spec is not None else 0.0  # what its prices are timed on
        while self._queue and self.kv.num_free:
            req = self._queue.popleft()
            self.kv.allocate(req.id)
            self._active.append(req)
        decoding = [r for r in self._active if self._uncached(r) == 0]
        prefill = self._plan_prefill()
        if not decoding and not prefill:
            return []
        try:
            events, num_decode_rows, num_decoding = self._run(decoding, prefill)
        except Exception as error:  # noqa: BLE001 - one request's failure must not end the others
            return self._replay_alone(decoding, prefill, error)
        self.stats.step_s += time.perf_counter() - started
        if spec is not None and not prefill:
            spec.observe_step(num_decoding, num_decode_rows, spec.clock() - priced_started)
        return events

    def _run(
        self, decoding: list[Request], prefill: list[tuple[Request, int]]
    ) -> tuple[list[TokenEvent], int, int]:
        """One step over these requests; returns the events, the decode rows and the requests decoded."""
        drafts = self._drafts(decoding, sum(n for _, n in prefill), self._step_index, self.stats)
        failed = [TokenEvent(r.id, [], "error") for r in decoding if r.finish_reason == "error"]
        if failed:
            decoding = [r for r in decoding if r.finish_reason is None]
            if not decoding and not prefill:
                return failed, 0, 0
        out, offsets, num_decode_rows, num_rows = self._forward(decoding, drafts, prefill)
        # Past this point each request commits alone: a failure there fails that request only
        # (VerifyStage), so nothing committed here is ever replayed.
        events = failed + self._verify(decoding, drafts, out, offsets, self.stats)

        self._step_index += 1
        s = self.stats
        s.steps += 1
        s.prefill_tokens += sum(n for _, n in prefill)
        s.forward_tokens += num_rows
        s.max_forward_tokens = max(s.max_forward_tokens, num_rows)
        return events, num_decode_rows, len(decoding)

    def _forward(
        self, decoding: list[Request], drafts: Drafts, prefill: list[tuple[Request, int]]
    ) -> tuple[FlatOutput, list[int], int, int]:
        """One target forward over every decoding request's anchor and drafts and every prefill
        chunk; returns the output, each decoding request's anchor row, and the decode and total rows."""
        runs, ids, offsets = [], [], []
        for i, req in enumerate(decoding):
            offsets.append(len(ids))  # where the request's anchor sits in the flat batch
            ids += [req.state.token_ids[-1], *drafts.of(i, req)]
            runs.append(Run(self.kv.slot(req.id), self.kv.length(req.id), len(ids) - offsets[-1]))
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
        self.stats.forward_s += time.perf_counter() - forward_started
        offset = num_decode_rows
        for req, n in prefill:
            if out.features is not None:
                req.state.features = req.features.append(out.features[offset : offset + n])
            self.kv.set_length(req.id, self.kv.length(req.id) + n)
            offset += n
        return out, offsets, num_decode_rows, len(ids)

    def _replay_alone(
        self, decoding: list[Request], prefill: list[tuple[Request, int]], error: Exception
    ) -> list[TokenEvent]:
        """A step that raised, run again one request at a time; a request that raises alone fails.

        The failed step committed nothing (drafting, scheduling, the forward and batched
        verification come before any commit), so each replay is an ordinary step of one
        request: lossless, and the requests that did not cause the failure progress.
        """
        logger.warning(
            "a step of %d request(s) failed (%r); replaying it one request at a time",
            len(decoding) + len(prefill),
            error,
        )
        events: list[TokenEvent] = []
        for req, n in [(r, 0) for r in decoding] + prefill:
            if n:  # a prefill chunk the failed step already cached is not sent again
                n = min(n, self._uncached(req))
            if req.finish_reason is not None:  # ended inside the failed step (its drafts were corrupt)
                events.append(TokenEvent(req.id, [], req.finish_reason))
                continue
            if n == 0 and self._uncached(req) > 0:
                continue
            try:
                alone = ([req], []) if n == 0 else ([], [(req, n)])
                events += self._run(*alone)[0]
            except Exception as e:  # noqa: BLE001 - this request alone fails
                logger.exception("request %d failed alone; the engine serves on", req.id)
                req.error = f"the engine failed on this request: {e!r}"
                self._finish(req, "error", None)
                events.append(TokenEvent(req.id, [], "error"))
        return events

    # -- admission, prefill and finish -------------------------------------------------

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

    def _finish(self, req: Request, reason: str, text: str | None) -> None:
        req.finish_reason, req.finished_at = reason, time.perf_counter()
        req.text = text if text is not None else (self.decode(req.generated) if self.decode else "")
        if req.id in self.kv:
            self.kv.release(req.id)
        if req in self._active:
            self._active.remove(req)
        if self.speculation is not None:
            self.speculation.forget(req)
        self._finished[req.id] = req
