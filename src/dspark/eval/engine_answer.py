"""One evaluation answer through the engine (DESIGN §12), with the confidences of its rounds.

The engine decodes exactly as it serves (same forward, same verification), so the
tokens/s an eval reports is the engine's. For acceptance figures that measure the
drafter, not the engine's policies, the request runs alone, verifies every draft
(``fixed``) and drafts every round (no speculation controller); greedy answers are then
identical to the batch-1 reference loop's.

Calibration needs each round's confidences ``c_1..c_ℓ``, which the engine does not
report: :class:`_ConfidenceTap` wraps the drafter and keeps the confidences of every
``propose`` call. With one request drafting every round, the k-th call is the k-th round
(drafting stops only at the end, when no budget is left), so the calls line up with
``GenerationResult.rounds``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.calibration.collect import ConfidenceRounds, RoundRecorder
from dspark.engine import Engine, EngineConfig
from dspark.protocols import (
    DraftBlock,
    Drafter,
    GenerationResult,
    SamplingParams,
    SequenceState,
    drafter_traits,
)
from dspark.targets import TargetAdapter


class _ConfidenceTap:
    """A drafter that forwards every call and keeps the confidences ``[K]`` of each proposal,
    by the request's token count when it was made (a round need not draft: the first does not
    for a drafter that cannot draft after the prompt)."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.target_layer_ids = drafter.target_layer_ids
        self.block_size = drafter.block_size
        self.traits = drafter_traits(drafter)
        self.confidences: dict[int, torch.Tensor | None] = {}  # len(token_ids) -> [K]

    def propose(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams]
    ) -> DraftBlock:
        assert len(states) == 1, "the tap follows one request"
        block = self.drafter.propose(states, max_len, sampling)
        conf = None if block.confidences is None else block.confidences[0].detach().cpu()
        self.confidences[len(states[0].token_ids)] = conf
        return block

    def update(self, state: SequenceState, num_accepted: int, new_features: torch.Tensor | None) -> None:
        self.drafter.update(state, num_accepted, new_features)


@dataclass(frozen=True)
class EngineAnswer:
    result: GenerationResult
    confidence: ConfidenceRounds  # rounds with confidences (drafters with a confidence head)


def engine_answer(
    target: TargetAdapter,
    drafter: Drafter | None,
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    block_size: int,
    group: int = 0,
) -> EngineAnswer:
    """Decode ``prompt_ids`` alone through a fresh engine sized for it; ``group`` tags its rounds."""
    tap = _ConfidenceTap(drafter) if drafter is not None else None
    capacity = min(target.max_context, len(prompt_ids) + params.max_tokens)
    config = EngineConfig(
        block_size=block_size, policy="fixed", max_batch=1, max_seq_len=capacity, payoff=False
    )
    engine = Engine(target, tap, config)
    result = engine.generate([prompt_ids], params)[0]
    recorder = RoundRecorder(group=group)
    position = len(prompt_ids)  # the request's token count at the start of each round
    for round_ in result.rounds:
        conf, k = (tap.confidences.get(position) if tap else None), round_.proposed
        position += round_.emitted
        if conf is not None and k > 0:
            block = DraftBlock(torch.zeros(1, k, dtype=torch.long), torch.tensor([k]), None, conf[None, :k])
            recorder(block, round_.accepted)
    return EngineAnswer(result, recorder.rounds(block_size))


def payoff_answer(
    target: TargetAdapter, drafter: Drafter, prompt_ids: list[int], params: SamplingParams, *, block_size: int
) -> GenerationResult:
    """Decode ``prompt_ids`` alone as the commands do: under the speculation controller.

    The slot holds at least 512 tokens, so prompts of different lengths share one SPS profile.
    """
    capacity = min(target.max_context, max(len(prompt_ids) + params.max_tokens, 512))
    config = EngineConfig(block_size=block_size, policy="fixed", max_batch=1, max_seq_len=capacity)
    return Engine(target, drafter, config).generate([prompt_ids], params)[0]
