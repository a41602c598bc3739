"""Stage 4 of an engine step (``engine/engine.py``): verify, commit or roll back, report.

Rejection sampling with per-request RNGs over the one flat forward's logits; each request's
KV kept to anchor + accepted drafts, its tokens cut at EOS / ``max_tokens`` / stop strings
(``decoding/stopping.py``) and streamed; the outcomes go to the drafter, the controller and
the online confidence estimator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from torch import Tensor

from dspark.decoding.stopping import Cut, cut_round
from dspark.engine.config import EngineStats
from dspark.engine.draft_stage import Drafts
from dspark.engine.kv import KVMemory
from dspark.engine.requests import Finish, Request, TokenEvent
from dspark.engine.speculation import Speculation
from dspark.protocols import DraftBlock, Drafter, RoundLog
from dspark.sampling import batch_probs, verify, verify_greedy
from dspark.sampling.argmax import greedy_tokens
from dspark.scheduler import ConfidenceEstimator
from dspark.targets import TargetAdapter
from dspark.targets.flat import FlatOutput

logger = logging.getLogger(__name__)


class VerifyStage:
    """The engine's verification and commit, over the engine's own (shared) collaborators.

    ``finish`` is the engine's way to end a request; counters go to the ``stats`` passed
    to each call, so that a caller may swap the engine's stats.
    """

    def __init__(
        self,
        *,
        target: TargetAdapter,
        kv: KVMemory,
        drafter: Drafter | None,
        estimator: ConfidenceEstimator,
        speculation: Speculation | None,
        decode: Callable[[list[int]], str] | None,
        finish: Finish,
    ) -> None:
        self.target, self.kv, self.drafter, self.estimator = target, kv, drafter, estimator
        self.speculation, self.decode, self._finish = speculation, decode, finish

    def __call__(
        self, decoding: list[Request], drafts: Drafts, out: FlatOutput, offsets: list[int], stats: EngineStats
    ) -> list[TokenEvent]:
        """Verify each decoding request's ``drafts``, commit, return the emitted tokens.

        ``offsets[i]`` is the flat row of request ``i``'s anchor in ``out``.
        """
        block, drafting, lengths = drafts.block, drafts.rows, drafts.lengths
        R = len(decoding)
        if R == 0:
            return []
        L = int(lengths.max())
        device = out.logits.device
        # Row t of request r: its anchor's flat row + t (rows past ℓ_r repeat the last, unused).
        rows = torch.tensor(offsets).unsqueeze(-1) + torch.minimum(torch.arange(L + 1), lengths.unsqueeze(-1))
        rows = rows.to(device)  # [R, L+1]
        params = [r.params for r in decoding]
        tokens = torch.zeros(R, L, dtype=torch.long, device=device)  # [R, L]
        n_verified = lengths.tolist()
        for i, (req, n) in enumerate(zip(decoding, n_verified)):
            if n > 0:
                tokens[i, :n] = block.tokens[drafting[req.id], :n].to(device)
        greedy = [p.greedy for p in params]
        if all(greedy):  # tokens against the logits' argmax: no V-wide rows built
            result = verify_greedy(tokens, lengths.to(device), greedy_tokens(out.logits)[rows])
        else:
            target_probs = batch_probs(out.logits[rows], params)  # [R, L+1, V]
            result = verify(
                tokens,
                lengths.to(device),
                self._draft_probs(decoding, block, drafting, n_verified, target_probs),
                target_probs,
                greedy=torch.tensor(greedy, device=device),
                generators=[r.generator for r in decoding],
            )
        n_accepted = result.num_accepted.tolist()
        self._observe(decoding, block, drafting, n_verified, n_accepted, stats)
        events, finished = [], []
        drafted, next_tokens = tokens.tolist(), result.next_tokens.tolist()
        for i, (req, n, accepted) in enumerate(zip(decoding, n_verified, n_accepted)):
            emitted = drafted[i][:accepted] + [next_tokens[i]]  # accepted drafts + recovered/bonus
            try:
                drafted_now = req.id in drafting
                event, cut = self._commit(req, n, accepted, emitted, out, offsets[i], drafted_now, stats)
            except Exception as e:  # noqa: BLE001 - a failure here is this request's alone
                logger.exception("request %d failed in its commit; the engine serves on", req.id)
                req.error = f"the engine failed on this request: {e!r}"
                event, cut = TokenEvent(req.id, [], "error"), None
                finished.append((req, None))
            events.append(event)
            if cut is not None and cut.finish_reason is not None:
                finished.append((req, cut))
        # Free slots only now: a release moves another request's slot, whose committed
        # length must already include this step's tokens.
        for req, cut in finished:
            if cut is None:
                self._finish(req, "error", None)
            else:
                self._finish(req, cut.finish_reason, cut.text)
        return events

    def _commit(
        self,
        req: Request,
        n: int,
        accepted: int,
        emitted: list[int],
        out: FlatOutput,
        offset: int,
        drafted: bool,
        stats: EngineStats,
    ) -> tuple[TokenEvent, Cut]:
        """Commit one request's round: KV, features, tokens, stop rules, its drafter; ``(event, cut)``."""
        start = self.kv.length(req.id)
        self.kv.set_length(req.id, start + 1 + accepted)  # anchor + accepted drafts; the rest rolls back
        new_features = None
        told = self.drafter is not None and (self.speculation is None or self.speculation.tells_model(req))
        if out.features is not None and told:
            new_features = out.features[offset : offset + 1 + accepted]  # [a+1, L, H]
            req.state.features = req.features.append(new_features)
        elif out.features is not None:  # copied in when the drafter next reads them
            req.features.defer(out.features, offset, offset + 1 + accepted)
        eos, stop = self.target.eos_token_ids, req.params.stop
        cut = cut_round(req.generated, emitted, eos, req.max_new, stop, self.decode)
        req.generated += cut.tokens
        req.state.token_ids += cut.tokens
        req.rounds.append(RoundLog(proposed=n, accepted=accepted, emitted=len(cut.tokens)))
        if self.speculation is not None:
            self.speculation.observe_round(req, n, accepted, drafted)
        stats.emitted += len(cut.tokens)
        if req.on_tokens is not None and cut.tokens:
            req.on_tokens(cut.tokens)
        if cut.finish_reason is None and told:
            update_started = time.perf_counter()
            priced_started = self.speculation.clock() if self.speculation is not None else 0.0
            self.drafter.update(req.state, accepted, new_features)
            if self.speculation is not None:
                self.speculation.observe_update(req, self.speculation.clock() - priced_started)
            stats.update_s += time.perf_counter() - update_started
        return TokenEvent(req.id, cut.tokens, cut.finish_reason), cut

    @staticmethod
    def _draft_probs(
        decoding: list[Request],
        block: DraftBlock,
        drafting: dict[int, int],
        n_verified: list[int],
        like: Tensor,
    ) -> Tensor | None:
        """The verified rows' draft distributions ``[R, L, V]``, None when the block's are one-hot."""
        L = like.shape[1] - 1
        if block.probs is None or L == 0:
            return None
        probs = like.new_zeros(len(decoding), L, like.shape[-1])  # [R, L, V]
        for i, (req, n) in enumerate(zip(decoding, n_verified)):
            if n > 0:
                probs[i, :n] = block.probs[drafting[req.id], :n].to(probs)
        return probs

    def _observe(
        self,
        decoding: list[Request],
        block: DraftBlock,
        drafting: dict[int, int],
        verified: list[int],
        accepted: list[int],
        stats: EngineStats,
    ) -> None:
        """Count the round's outcomes and feed them to the online confidence estimator."""
        stats.rounds += len(decoding)
        stats.verified += sum(verified)
        stats.accepted += sum(accepted)
        if drafting and block.max_len > 0:
            idx = [i for i, r in enumerate(decoding) if r.id in drafting]
            rows = torch.tensor([drafting[decoding[i].id] for i in idx])
            self.estimator.observe(
                block.peaks()[rows],
                torch.tensor([verified[i] for i in idx]),
                torch.tensor([accepted[i] for i in idx]),
            )
