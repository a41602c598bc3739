"""The batch-1 loop and the engine count rounds the same way (issue 13): one RoundLog per verify.

The loop is the engine's test oracle; for that its rounds must line up one to one with
the engine's: the first round drafts from the prompt's last token (no uncounted plain
round for the first token), and every round, drafted or not, is one RoundLog.
"""

from __future__ import annotations

import pytest

from dspark.decoding import speculative_generate
from dspark.drafters.ngram import NgramDrafter
from dspark.eval.engine_answer import engine_answer
from dspark.protocols import SamplingParams

from .conftest import hf_greedy
from .drafters_for_tests import OracleDrafter, RandomDrafter

GREEDY = SamplingParams(temperature=0.0, max_tokens=40)


def _with_block_size(drafter, block_size: int):
    if drafter is not None and not hasattr(drafter, "block_size"):
        drafter.block_size = block_size  # the loop's test drafters take it per call
    return drafter


def _rounds(result) -> list[tuple[int, int, int]]:
    return [(r.proposed, r.accepted, r.emitted) for r in result.rounds]


@pytest.mark.parametrize("name", ["none", "ngram", "random", "oracle"])
def test_loop_and_engine_rounds_are_the_same(no_eos, prompt, name):
    reference = hf_greedy(no_eos, prompt, GREEDY.max_tokens)
    make = {
        "none": lambda: None,
        "ngram": lambda: NgramDrafter(128),
        "random": lambda: RandomDrafter(128),
        "oracle": lambda: OracleDrafter(len(prompt), reference, 128),
    }[name]
    loop = speculative_generate(no_eos, make(), prompt, GREEDY, block_size=5)
    engine = engine_answer(no_eos, _with_block_size(make(), 5), prompt, GREEDY, block_size=5).result
    assert loop.token_ids == engine.token_ids == reference
    assert _rounds(loop) == _rounds(engine)
    assert sum(r.emitted for r in loop.rounds) == GREEDY.max_tokens  # every token has its round
    if name == "oracle":
        assert loop.rounds[0].proposed == 5 and loop.rounds[0].accepted == 5  # the first round drafts
    if name == "none":
        assert len(loop.rounds) == GREEDY.max_tokens and loop.tau == engine.tau == 1.0
