"""Eval answers through the engine: greedy tokens equal the batch-1 loop's; rounds keep their confidences."""

from __future__ import annotations

import pytest
import torch

from dspark.decoding import speculative_generate
from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
from dspark.eval.engine_answer import engine_answer
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter

GAMMA = 4


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> TargetAdapter:
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    return TargetAdapter.from_pretrained(build_tiny_chat_target(tmp_path_factory.mktemp("t")))


def test_greedy_tokens_equal_the_loop_and_every_drafting_round_is_recorded(target):
    from tests.unit.data.tiny_chat_target import mask_token_id

    torch.manual_seed(0)
    config = DSparkConfig(num_layers=1, block_size=GAMMA, mask_token_id=mask_token_id(target.tokenizer))
    drafter = DSparkDrafter.from_target(target, config)
    ids = target.tokenizer("Explain how a hash table resolves collisions.")["input_ids"]
    params = SamplingParams(temperature=0.0, max_tokens=24)

    answer = engine_answer(target, drafter, ids, params, block_size=GAMMA, group=3)
    loop = speculative_generate(target, drafter, ids, params, block_size=GAMMA)
    assert answer.result.token_ids == loop.token_ids

    drafting = [r for r in answer.result.rounds if r.proposed > 0]
    rounds = answer.confidence
    assert rounds.num_rounds == len(drafting) > 0  # DSpark reports confidences every round
    assert rounds.proposed.tolist() == [r.proposed for r in drafting]
    assert rounds.accepted.tolist() == [r.accepted for r in drafting]
    assert set(rounds.group.tolist()) == {3}
    for row, r in zip(rounds.confidences, drafting):
        assert ((row[: r.proposed] > 0) & (row[: r.proposed] < 1)).all()


def test_plain_decoding_has_no_drafts(target):
    ids = target.tokenizer("def add(a, b):")["input_ids"]
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=4)
    answer = engine_answer(target, None, ids, params, block_size=0)
    loop = speculative_generate(target, None, ids, params)
    assert answer.result.token_ids == loop.token_ids  # seeded sampling too: the same RNG draws
    assert all(r.proposed == 0 for r in answer.result.rounds) and answer.confidence.num_rounds == 0
