"""Lossless against the target as loaded: in bf16, greedy speculative output equals plain greedy.

The default dtype on CPUs with native bf16 (issue 17, ``targets/dtype.py``). A k-token
verification and a 1-token decode step round differently in bf16 (≈ 1e-2 on O(1)
logits, against ≈ 1e-6 in fp32), so, as the fp32 tests do at their scale, prompts whose
greedy path passes a near-tie are left out: the comparison tests the decoding, not bf16.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from dspark.decoding import speculative_generate
from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
from dspark.drafters.ngram import NgramDrafter
from dspark.engine import Engine, EngineConfig
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter
from tests.conftest import TINY_DIMS

from .conftest import VOCAB, greedy_references, make_prompts

MAX_NEW = 16
# Smallest top-1/top-2 logit gap on the greedy path: 4 bf16 ulps at |logit| < 2 (a 1-ulp
# gap does flip between a verification and a decode step on this model).
BF16_MARGIN = 0.03


@pytest.fixture(scope="module")
def target_bf16() -> TargetAdapter:
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**TINY_DIMS)).eval().to(torch.bfloat16)
    t = TargetAdapter(model)
    t.eos_token_ids = ()
    t.model.generation_config.eos_token_id = None
    return t


@pytest.fixture(scope="module")
def cases(target_bf16):
    """Prompts with comfortable bf16 margins and our plain greedy decoding of each (the reference)."""
    candidates = make_prompts(40, seed=5)
    kept = [
        p
        for p, (_, gap) in zip(candidates, greedy_references(target_bf16, candidates, MAX_NEW))
        if gap > BF16_MARGIN
    ]
    assert len(kept) >= 6, f"only {len(kept)} prompts clear the bf16 margin"
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    refs = [speculative_generate(target_bf16, None, p, params).token_ids for p in kept[:6]]
    return kept[:6], refs


def drafters(target: TargetAdapter) -> dict:
    torch.manual_seed(1)
    config = DSparkConfig(num_layers=1, block_size=4, mask_token_id=VOCAB - 1, markov_rank=8)
    dspark = DSparkDrafter.from_target(target, config).eval()
    assert next(dspark.parameters()).dtype == torch.bfloat16  # the drafter follows the target's dtype
    return {"ngram": NgramDrafter(VOCAB), "dspark": dspark}


@pytest.mark.parametrize("name", ["ngram", "dspark"])
def test_batch1_loop_equals_plain_greedy_in_bf16(target_bf16, cases, name):
    prompts, refs = cases
    drafter = drafters(target_bf16)[name]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    for prompt, ref in zip(prompts, refs):
        assert speculative_generate(target_bf16, drafter, prompt, params, block_size=4).token_ids == ref


@pytest.mark.parametrize("name", ["ngram", "dspark"])
@pytest.mark.parametrize("batch", [1, 4])
def test_engine_equals_plain_greedy_in_bf16(target_bf16, cases, name, batch):
    prompts, refs = cases
    config = EngineConfig(payoff=False, block_size=4, policy="fixed", max_batch=batch, max_seq_len=128)
    engine = Engine(target_bf16, drafters(target_bf16)[name], config)
    results = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    assert [r.token_ids for r in results] == refs
    assert engine.stats.accepted > 0 or name == "dspark"  # n-gram drafts on these repetitive prompts
