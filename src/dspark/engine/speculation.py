"""The engine's side of the speculation controller (DESIGN §9.0): offers, prices, proposals, outcomes.

It turns requests and clocks into the controller's plain numbers and carries its decisions
out. A deterministic proposer (prompt lookup) proposes before the plan (its proposal bounds
its offer) and is checked afterwards against what the request emitted (its shadow). Prices
are the engine's own step and drafting seconds on one clock (``scheduler/costs.py``,
:func:`~dspark.engine.profile.pricing_clock`). Each proposer
drafts once for the requests that chose it, and the parts merge into one block
(:func:`merge_blocks`), every row what its proposer would have drafted alone (lossless).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch

from dspark.drafters.ngram import NgramConfig, NgramDrafter
from dspark.protocols import DraftBlock, Drafter, drafter_traits
from dspark.scheduler.acceptance import shadow_outcome
from dspark.scheduler.controller import Controller, ControllerConfig, Offer, RoundCosts, Spec
from dspark.scheduler.costs import DraftCosts, StepCosts
from dspark.scheduler.profile import SpsTable

NGRAM, MODEL = "ngram", "model"


class Speculation:
    """Per-round proposer choice for an engine. ``draft_costs`` fixes the drafting seconds per
    request instead of measuring them, and steps are priced by ``sps`` alone: a timing for tests.
    ``waiting`` counts the requests waiting for a KV slot (none: the batch drains)."""

    def __init__(
        self,
        drafter: Drafter,
        vocab_size: int,
        block_size: int,
        sps: SpsTable,
        *,
        choose_proposer: bool = True,
        config: ControllerConfig | None = None,
        draft_costs: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        waiting: Callable[[], int] = lambda: 0,
    ) -> None:
        self.proposers: dict[str, Drafter] = {}
        if drafter_traits(drafter).deterministic:
            self.proposers[NGRAM] = drafter
        else:
            self.proposers[MODEL] = drafter
            if choose_proposer:
                self.proposers[NGRAM] = NgramDrafter(vocab_size, NgramConfig(block_size=max(block_size, 1)))
        self.traits = {name: drafter_traits(p) for name, p in self.proposers.items()}
        self.controller = Controller({n: t.deterministic for n, t in self.traits.items()}, config)
        self.vocab_size, self.clock, self.waiting = vocab_size, clock, waiting
        self.fixed_costs = dict(draft_costs) if draft_costs is not None else None
        self.steps = StepCosts(sps)
        self.calls = {name: DraftCosts() for name, t in self.traits.items() if not t.deterministic}
        self.update_s = 0.0  # a lazy model's update after its own round, per request (EMA)
        self.drafting_s = 0.0  # drafter seconds inside the current step (not the step's own)
        self._proposed: dict[str, tuple[DraftBlock, dict[int, int]]] = {}  # this round's lookups

    # -- plan ---------------------------------------------------------------------------

    def plan(self, decoding: list, K: int) -> list[Spec]:
        """Every decoding request's :class:`Spec` this round."""
        proposals = self._deterministic_proposals(decoding, K)
        offers = []
        for req in decoding:
            caps, budget = {}, min(K, max(req.draft_budget, 0))
            for name, traits in self.traits.items():
                if traits.deterministic:
                    caps[name] = min(len(proposals[name][req.id]), budget)
                else:
                    caps[name] = budget if (req.generated or traits.after_prompt) else 0
            offers.append(Offer(req.id, caps))
        specs = self.controller.plan(offers, self._costs(len(decoding), K))
        for req, spec in zip(decoding, specs):
            req.proposer = spec.proposer
            for name, found in proposals.items():
                if spec.proposer == name:  # observed for real this round
                    req.shadow = None if req.shadow and req.shadow[0] == name else req.shadow
                elif req.shadow is None and found[req.id]:  # rule 3: observed by its shadow
                    req.shadow = (name, len(req.generated), found[req.id])
        return specs

    def _deterministic_proposals(self, decoding: list, K: int) -> dict[str, dict[int, list[int]]]:
        """Each deterministic proposer's proposal for every request (its seconds are the step's);
        its block is kept for :meth:`propose` (:attr:`_proposed`: block and row by request id)."""
        out, self._proposed = {}, {}
        for name, traits in self.traits.items():
            if traits.deterministic and decoding:
                states, params = [r.state for r in decoding], [r.params for r in decoding]
                block = self.proposers[name].propose(states, K, params)
                self._proposed[name] = (block, {r.id: i for i, r in enumerate(decoding)})
                rows, lengths = block.tokens.tolist(), block.lengths.tolist()
                out[name] = {r.id: row[:n] for r, row, n in zip(decoding, rows, lengths)}
        return out

    def _costs(self, num_requests: int, K: int) -> RoundCosts:
        verify_s, rho = self.steps.prices(num_requests, K)
        if self.fixed_costs is not None:
            return RoundCosts(rho=rho, verify_s=verify_s, draft_s=self.fixed_costs)
        a, c, b = self.steps.model(num_requests, K)
        drains = num_requests > 1 and a + c * num_requests > 0 and not self.waiting()
        fixed_share = a / (a + c * num_requests) if drains else 0.0
        draft_s, call_s = {}, {}  # a deterministic proposer's: none (it proposed for everyone anyway)
        for name, calls in self.calls.items():
            rows = self.traits[name].rows_per_request(K)
            call_s[name], draft_s[name] = calls.split((a, c + b * (rows - 1)))
            if self.traits[name].lazy:
                draft_s[name] += self.update_s
        return RoundCosts(rho=rho, verify_s=verify_s, draft_s=draft_s, call_s=call_s, fixed_share=fixed_share)

    # -- propose ------------------------------------------------------------------------

    def propose(
        self,
        decoding: list,
        specs: list[Spec],
        K: int,
        fill_confidences: Callable[[torch.Tensor], torch.Tensor],
    ) -> tuple[DraftBlock, list, dict[int, int]]:
        """One merged block over the drafting requests: ``(block, drafting requests, caps by id)``.
        ``fill_confidences`` maps peaks ``[n, K]`` to confidences for rows without their own."""
        parts = []
        for name, proposer in self.proposers.items():
            chosen = [r for r, s in zip(decoding, specs) if s.proposer == name]
            if not chosen:
                continue
            if self.traits[name].deterministic:  # its plan-time block, each row cut at its cap
                block, rows = self._proposed[name]
                index = torch.tensor([rows[r.id] for r in chosen])  # [n]
                caps = torch.tensor([s.cap for r, s in zip(decoding, specs) if s.proposer == name])  # [n]
                lengths = torch.minimum(block.lengths[index], caps)
                parts.append((chosen, DraftBlock(tokens=block.tokens[index], lengths=lengths, probs=None)))
                continue
            for req in chosen:  # rows of rounds it was not told about
                req.sync_features()
            if self.traits[name].lazy:
                self._catch_up(proposer, chosen)
            started = self.clock()
            # Always γ drafts, capped per request: a seeded request draws the same drafter randomness.
            parts.append((chosen, proposer.propose([r.state for r in chosen], K, [r.params for r in chosen])))
            elapsed = self.clock() - started
            self.drafting_s += elapsed
            if self.fixed_costs is None:
                self.calls[name].observe(len(chosen), elapsed)
        caps = {r.id: s.cap for r, s in zip(decoding, specs) if s.proposer is not None}
        block = merge_blocks(parts, K, self.vocab_size, fill_confidences)
        return block, [r for rs, _ in parts for r in rs], caps

    def _catch_up(self, proposer, chosen: list) -> None:
        """Absorb each request's pending tokens before the call, so that the call's seconds
        (the drafting-cost fit's points) hold drafting alone; the catch-up is drafting's too."""
        started = self.clock()
        for req in chosen:
            if proposer.pending(req.state):
                proposer.catch_up([req.state], [req.params])
        self.drafting_s += self.clock() - started

    # -- observe ------------------------------------------------------------------------

    def tells_model(self, req) -> bool:
        """Tell the model drafter about this round now? A lazy one only after its own rounds."""
        return MODEL in self.proposers and (req.proposer == MODEL or not self.traits[MODEL].lazy)

    def observe_update(self, req, seconds: float) -> None:
        """The lazy model drafter's update after ``req``'s own round took ``seconds``: drafting's."""
        if req.proposer == MODEL and self.traits[MODEL].lazy:
            self.drafting_s += seconds
            self.update_s = 0.9 * self.update_s + 0.1 * seconds if self.update_s else seconds

    def observe_round(self, req, verified: int, accepted: int, drafted: bool) -> None:
        """A committed round (``req.generated`` holds its tokens): its outcome, and the shadow's."""
        # A model's first round after the prompt is left out: a drafter trained on prompt-end
        # anchors learns it apart (0.5-0.9 of 7 accepted there against 2-3.6 later, tiny target).
        proposer = req.proposer if drafted else None
        if proposer is not None and (len(req.rounds) > 1 or self.traits[proposer].deterministic):
            self.controller.observe(req.id, proposer, verified, accepted)
        if req.shadow is not None:
            name, start, proposal = req.shadow
            outcome = shadow_outcome(proposal, req.generated[start:])
            if outcome is not None:
                self.controller.observe(req.id, name, *outcome)
                req.shadow = None

    def start_step(self) -> float:
        """A step begins: the drafting seconds inside it count from zero. Returns :attr:`clock`."""
        self.drafting_s = 0.0  # a step with prefill is not observed: its drafting must not carry over
        return self.clock()

    def observe_step(self, num_requests: int, num_rows: int, seconds: float) -> None:
        """A step without prefill took ``seconds`` on :attr:`clock`; the drafters' part is drafting's."""
        if self.fixed_costs is None:
            self.steps.observe(num_requests, num_rows, seconds - self.drafting_s)

    def forget(self, req) -> None:
        self.controller.forget(req.id)


def merge_blocks(
    parts: list[tuple[list, DraftBlock]],
    K: int,
    vocab_size: int,
    fill_confidences: Callable[[torch.Tensor], torch.Tensor],
) -> DraftBlock:
    """Rows of every part, in order, padded to K drafts; confidences kept iff some part has them.

    ``fill_confidences`` maps peaks ``[n, K]`` (:meth:`DraftBlock.peaks`) to confidences for
    the rows of a part without its own. The merged block is one-hot (``probs`` None) when
    every part is; otherwise the one-hot parts' rows are built (a sampled round mixing an
    n-gram proposal with a model draft: the only case that pays for them).
    """
    parts = [(reqs, b) for reqs, b in parts if reqs]
    if not parts:
        return DraftBlock.empty(0, vocab_size)
    if len(parts) == 1 and parts[0][1].max_len == K:
        return parts[0][1]
    dense = next((b.probs for _, b in parts if b.probs is not None and b.max_len > 0), None)
    tokens, lengths, probs, confs = [], [], [], []
    with_conf = any(b.confidences is not None for _, b in parts)
    for _, b in parts:
        n, k = b.tokens.shape
        t = torch.zeros(n, K, dtype=torch.long)
        t[:, :k] = b.tokens.cpu()
        tokens.append(t)
        lengths.append(b.lengths.cpu().clamp(max=K))
        if dense is not None:
            p = dense.new_zeros(n, K, dense.shape[-1])  # [n, K, V]
            if b.probs is not None:
                p[:, :k] = b.probs.to(p)
            else:  # one-hot at the tokens (the padding's rows too: distributions, never read)
                p.scatter_(-1, t.to(p.device).unsqueeze(-1), 1.0)
            probs.append(p)
        if with_conf:
            c = b.confidences if b.confidences is not None else fill_confidences(b.peaks())
            cc = torch.zeros(n, K)
            cc[:, :k] = c.cpu().float()[:, :K]
            confs.append(cc)
    return DraftBlock(
        tokens=torch.cat(tokens),
        lengths=torch.cat(lengths),
        probs=torch.cat(probs) if dense is not None else None,
        confidences=torch.cat(confs) if with_conf else None,
    )
