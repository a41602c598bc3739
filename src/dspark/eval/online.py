"""Real τ during training: a few held-out prompts decoded through the engine (SPEC §6).

The trainer's ``online_eval`` hook logs it as ``eval/tau`` beside the expected τ of the
training batches, so the training/serving gap is visible while a run goes.
"""

from __future__ import annotations

from collections.abc import Callable

from dspark.data.chat import prompt_ids as first_turn_ids
from dspark.data.prompts import load_prompts
from dspark.eval.engine_answer import engine_answer
from dspark.protocols import SamplingParams, acceptance_length


def online_tau_eval(
    target, prompt_specs: str, count: int = 6, max_tokens: int = 48
) -> Callable[[object, int], dict[str, float]]:
    """``evaluate(drafter, step) -> {"tau": ...}`` over ``count`` prompts of ``prompt_specs``.

    Temperature 1 with fixed seeds; each prompt decoded alone through the engine, as
    ``dspark eval`` decodes it.
    """
    per_set = max(1, count // len(prompt_specs.split(",")))
    prompts = [p for spec in prompt_specs.split(",") for p in load_prompts(spec, per_set)]
    ids = [first_turn_ids(target.tokenizer, p) for p in prompts]

    def evaluate(drafter, step: int) -> dict[str, float]:
        rounds = accepted = 0
        for i, prompt_ids in enumerate(ids):
            params = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=i)
            result = engine_answer(target, drafter, prompt_ids, params, block_size=drafter.block_size).result
            rounds += len(result.rounds)
            accepted += sum(r.accepted for r in result.rounds)
        return {"tau": acceptance_length(accepted, rounds)}

    return evaluate
