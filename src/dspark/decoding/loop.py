"""Batch-1 speculative decoding: prefill → (draft → verify → commit/rollback)* (DESIGN §3).

A handful of small functions in the spirit of gpt-fast's ``generate.py``. This is the
*reference loop*, a test oracle: the whole algorithm for one request on the adapter's
own KV cache, which the engine's greedy output and rounds are tested against. Every
product path (``generate``, ``serve``, ``eval``, ``calibrate``, ``train``'s online τ,
regeneration) decodes through the batched engine (DESIGN §10), the one step loop; the
loop here remains the "loop" baseline column of ``bench decode`` and the plain decoding
of ``bench target``.

Rounds are counted as the engine counts them: the prompt but its last token is
prefilled, the first round's anchor is the last prompt token (so the first round may
already draft), and every verification is one :class:`~dspark.protocols.RoundLog`,
drafted or not (``tests/unit/decoding/test_loop_rounds.py`` compares the two).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dspark.decoding.stopping import Cut, cut_round
from dspark.errors import DsparkError, PromptTooLongError
from dspark.protocols import (
    DraftBlock,
    Drafter,
    GenerationResult,
    RoundLog,
    SamplingParams,
    SequenceState,
    drafter_traits,
)
from dspark.sampling import batch_probs, verify
from dspark.targets import TargetAdapter, TargetCache

OnTokens = Callable[[list[int]], None]
# Called after each drafting round with the verified block and its accepted count; the
# calls line up one to one with ``GenerationResult.rounds`` (calibration reads c_1..c_K).
OnRound = Callable[[DraftBlock, int], None]


@dataclass
class _Request:
    """Loop-private state of the one request being decoded."""

    state: SequenceState
    params: SamplingParams
    generator: torch.Generator | None
    cache: TargetCache
    greedy: torch.Tensor  # [1] bool


@dataclass
class Transcript:
    """What a batch-1 loop's request has emitted: each round cut by the stop rules
    (``decoding/stopping.py``), appended, logged and streamed; then the result."""

    state: SequenceState
    params: SamplingParams
    eos: tuple[int, ...]
    max_new: int
    decode: Callable[[list[int]], str] | None
    on_tokens: OnTokens | None
    started: float  # perf_counter at the request's start (prefill included)
    generated: list[int] = field(default_factory=list)
    rounds: list[RoundLog] = field(default_factory=list)
    cut: Cut | None = None

    @property
    def finished(self) -> bool:
        return self.cut is not None and self.cut.finish_reason is not None

    def draft_budget(self, block_size: int) -> int:
        """Drafts worth proposing: a round emits at most drafts + 1 tokens."""
        return min(block_size, self.max_new - len(self.generated) - 1)

    def commit(self, emitted: list[int], proposed: int, accepted: int) -> Cut:
        cut = cut_round(self.generated, emitted, self.eos, self.max_new, self.params.stop, self.decode)
        self.generated.extend(cut.tokens)
        self.state.token_ids.extend(cut.tokens)
        self.rounds.append(RoundLog(proposed=proposed, accepted=accepted, emitted=len(cut.tokens)))
        if self.on_tokens is not None and cut.tokens:
            self.on_tokens(cut.tokens)
        self.cut = cut
        return cut

    def result(self) -> GenerationResult:
        cut = self.cut
        text = cut.text if cut.text is not None else (self.decode(self.generated) if self.decode else "")
        return GenerationResult(
            token_ids=self.generated,
            text=text,
            finish_reason=cut.finish_reason,
            rounds=self.rounds,
            seconds=time.perf_counter() - self.started,
        )


def _needs_features(drafter: Drafter | None) -> bool:
    return drafter is not None and len(drafter.target_layer_ids) > 0


def _features_of(target: TargetAdapter, drafter: Drafter | None, ids: torch.Tensor, cache: TargetCache):
    """The target forward with the drafter's feature layers (an argument, not adapter state)."""
    if not _needs_features(drafter):
        return target.forward(ids, cache, with_features=False)
    out = target.forward(ids, cache, with_features=True, layer_ids=drafter.target_layer_ids)
    assert out.layer_ids == tuple(drafter.target_layer_ids), (out.layer_ids, drafter.target_layer_ids)
    return out


def _round(
    target: TargetAdapter, drafter: Drafter | None, req: _Request, block: DraftBlock
) -> tuple[list[int], int, torch.Tensor | None]:
    """Verify one draft block; commit the accepted prefix to the KV cache.

    Returns the emitted tokens (accepted drafts + recovered/bonus), the number of
    accepted drafts and the new features ``[a+1, L, H]`` (anchor + accepted drafts),
    which are also appended to the state. The cache is rolled back to the accepted
    length.
    """
    k = int(block.lengths[0])
    drafts = block.tokens[:, :k]  # [1, k]
    anchor = torch.tensor([[req.state.token_ids[-1]]])
    ids = torch.cat([anchor, drafts], dim=1).to(target.device)  # [1, k+1]
    start = req.cache.length
    out = _features_of(target, drafter, ids, req.cache)
    target_probs = batch_probs(out.logits, [req.params])  # [1, k+1, V]
    draft_probs = block.probs[:, :k].to(target_probs) if block.probs is not None else None
    result = verify(
        drafts,
        block.lengths.clamp(max=k),
        draft_probs,
        target_probs,
        greedy=req.greedy,
        generators=[req.generator],
    )
    accepted = int(result.num_accepted[0])
    # Keep the anchor and the accepted drafts; the recovered/bonus token becomes the
    # next anchor and enters the cache with the next verification forward.
    target.rollback(req.cache, start + 1 + accepted)
    new = None
    if out.features is not None:
        new = out.features[0, : accepted + 1]  # [a+1, L, H]
        req.state.features = new if req.state.features is None else torch.cat([req.state.features, new])
    return result.emitted(drafts, 0), accepted, new


def prefill(
    target: TargetAdapter,
    drafter: Drafter | None,
    prompt_ids: list[int],
    params: SamplingParams,
    generator: torch.Generator | None,
) -> _Request:
    """Cache every prompt token but the last, which is the first round's anchor.

    As in the engine, the first token comes from the first round, which may already
    draft after the prompt: the rounds of the loop and of the engine line up one to one.
    """
    cache = target.new_cache()
    greedy = torch.tensor([params.greedy])
    req = _Request(SequenceState(0, list(prompt_ids), len(prompt_ids)), params, generator, cache, greedy)
    if len(prompt_ids) > 1:
        out = _features_of(target, drafter, torch.tensor([prompt_ids[:-1]], device=target.device), cache)
        req.state.features = None if out.features is None else out.features[0]
    return req


def start_request(
    target: TargetAdapter,
    drafter: Drafter | None,
    prompt_ids: list[int],
    params: SamplingParams,
    decode: Callable[[list[int]], str] | None,
) -> tuple[_Request, int]:
    """Check a request and prefill it: its state, and how many tokens it may generate."""
    if not prompt_ids:
        raise DsparkError("the prompt is empty")
    if len(prompt_ids) + 1 > target.max_context:
        raise PromptTooLongError(
            f"prompt has {len(prompt_ids)} tokens; the target's context is {target.max_context}"
        )
    if params.stop and decode is None:
        raise ValueError("stop strings need a decode function")
    generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    max_new = min(params.max_tokens, target.max_context - len(prompt_ids))
    return prefill(target, drafter, prompt_ids, params, generator), max_new


def speculative_generate(
    target: TargetAdapter,
    drafter: Drafter | None,
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    block_size: int = 7,
    decode: Callable[[list[int]], str] | None = None,
    on_tokens: OnTokens | None = None,
    on_round: OnRound | None = None,
) -> GenerationResult:
    """Generate up to ``params.max_tokens`` tokens after ``prompt_ids``, losslessly.

    ``drafter=None`` is plain autoregressive decoding through the same code path.
    ``decode`` turns ids into text (needed for stop strings and ``result.text``);
    ``on_tokens`` is called with each round's emitted tokens, for streaming;
    ``on_round(block, num_accepted)`` after each drafting round (see :data:`OnRound`).
    """
    started = time.perf_counter()
    req, max_new = start_request(target, drafter, prompt_ids, params, decode)
    out = Transcript(req.state, params, target.eos_token_ids, max_new, decode, on_tokens, started)
    while not out.finished:
        max_len = out.draft_budget(block_size)
        if not out.generated and drafter is not None and not drafter_traits(drafter).after_prompt:
            max_len = 0  # its first-round drafts are never accepted (DrafterTraits.after_prompt)
        block = (
            drafter.propose([req.state], max_len, [params])
            if drafter is not None and max_len > 0
            else DraftBlock.empty(1, target.vocab_size)
        )
        if bool(block.invalid_rows().any()):
            raise DsparkError(
                "the drafter produced non-finite probabilities (corrupt drafter weights?); decoding stopped"
            )
        emitted, accepted, new_features = _round(target, drafter, req, block)
        out.commit(emitted, int(block.lengths[0]), accepted)
        if on_round is not None:
            on_round(block, accepted)
        if drafter is not None:
            drafter.update(req.state, accepted, new_features)
    return out.result()
