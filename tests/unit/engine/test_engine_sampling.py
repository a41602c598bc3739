"""Sampled requests under batching: reproducible per seed, and distributed as the target (DESIGN §3, §9)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

import dspark.engine.draft_stage as draft_stage
from dspark.engine import Engine, EngineConfig
from dspark.protocols import SamplingParams
from dspark.sampling import process_logits
from dspark.scheduler import SpsTable, global_search

from .conftest import VOCAB, make_prompts
from .drafters import SeededRandomDrafter, TargetDrafter
from .test_engine_greedy import run_engine

APPENDIX_A_SPS = SpsTable.from_dict({1: 1.0, 2: 0.5, 3: 0.45})


def sampled_params(n: int, max_tokens: int = 24) -> list[SamplingParams]:
    """Seeded requests with a mix of plain, top-k and top-p sampling, and one greedy."""
    params = [
        SamplingParams(
            temperature=0.8 + 0.1 * (i % 3),
            top_k=20 if i % 3 == 1 else 0,
            top_p=0.9 if i % 3 == 2 else 1.0,
            max_tokens=max_tokens,
            seed=100 + i,
        )
        for i in range(n - 1)
    ]
    return params + [SamplingParams(temperature=0.0, max_tokens=max_tokens)]


@pytest.mark.parametrize("policy", ["fixed", "fixed:3", "threshold:0.5", "none"])
def test_seeded_requests_same_alone_or_batched(target, policy):
    """A seeded request gives the same tokens alone and in a batch (batch-independent policies)."""
    prompts = make_prompts(10, seed=5)
    params = sampled_params(10)
    drafter = (
        None if policy == "none" else SeededRandomDrafter(VOCAB, sharpness=1.0, confident=tuple(range(3, 70)))
    )
    config = EngineConfig(payoff=False, policy="fixed" if policy == "none" else policy, max_batch=4)
    batched = run_engine(Engine(target, drafter, config), prompts, params, join_after=2)
    for prompt, sp, result in zip(prompts, params, batched):
        alone = Engine(
            target, drafter, EngineConfig(payoff=False, policy=config.policy, max_batch=1)
        ).generate([prompt], sp)[0]
        assert result.token_ids == alone.token_ids
        assert len(result.token_ids) == sp.max_tokens
    if drafter is not None:
        rounds = [r for res in batched for r in res.rounds]
        assert 0 < sum(r.accepted for r in rounds) < sum(r.proposed for r in rounds)


def target_first_token_probs(target, prompt: list[int], params: SamplingParams) -> torch.Tensor:
    with torch.no_grad():
        logits = target.model(torch.tensor([prompt])).logits[0, -1]
    return process_logits(logits, params).double()  # [V]


def mass_buckets(p: torch.Tensor, n: int) -> torch.Tensor:
    """Token -> bucket id, ``n`` buckets of roughly equal target mass, most likely tokens first."""
    order = p.argsort(descending=True)
    cum = p[order].cumsum(0) - p[order]  # mass before each token
    bucket = torch.empty_like(order)
    bucket[order] = (cum * n).long().clamp(max=n - 1)
    return bucket


def first_tokens(engine: Engine, prompt: list[int], n: int, params: SamplingParams) -> torch.Tensor:
    ids = [engine.submit(prompt, SamplingParams(**{**vars(params), "seed": 1000 + i})) for i in range(n)]
    while engine.has_work():
        engine.step()
    return torch.tensor([engine.pop_result(i).token_ids[0] for i in ids])


def distribution_pvalue(tokens: torch.Tensor, p_t: torch.Tensor, buckets: torch.Tensor, n: int) -> float:
    observed = torch.bincount(buckets[tokens], minlength=n).double()
    expected = torch.zeros(n, dtype=torch.float64).index_add_(0, buckets, p_t)
    expected *= observed.sum() / expected.sum()
    return float(chisquare(observed.numpy(), expected.numpy()).pvalue)


@pytest.fixture(scope="module")
def appendix_a_setup(target):
    """A prompt, its first-token target distribution, and a favoured half of its mass."""
    prompt = make_prompts(1, seed=7)[0]
    params = SamplingParams(temperature=1.0, max_tokens=3)
    p_t = target_first_token_probs(target, prompt, params)
    buckets = mass_buckets(p_t, 8)
    favoured = {int(t) for t in torch.nonzero(buckets < 4).flatten()}  # ~half the target mass
    return prompt, params, p_t, buckets, favoured


@pytest.mark.parametrize("policy", ["prefix", "prefix-async"])
def test_prefix_policies_keep_the_target_distribution(target, appendix_a_setup, policy):
    """With Appendix-A confidences (c_2 depends on x_1) and a jagged SPS curve, the first
    token of 640 batched requests follows the target distribution (chi-square)."""
    prompt, params, p_t, buckets, favoured = appendix_a_setup
    jagged = SpsTable.from_dict({b: 1.0 / (1 + b / 40 + 0.5 * (b % 16 == 0)) for b in range(1, 200)})
    engine = Engine(
        target,
        TargetDrafter(target, favoured),
        EngineConfig(payoff=False, policy=policy, max_batch=64),
        sps=jagged,
    )
    tokens = first_tokens(engine, prompt, 640, params)
    assert engine.stats.verified > 0, "the scheduler should verify some drafts"
    assert distribution_pvalue(tokens, p_t, buckets, 8) > 1e-3


def test_anticipating_scheduler_is_caught(target, appendix_a_setup, monkeypatch):
    """The same check detects the bias of a global search without early stopping (Appendix A)."""
    prompt, params, p_t, buckets, favoured = appendix_a_setup

    def anticipating(policy, caps, confidences=None, *, sps=None, base_tokens=0, **_):
        return global_search(confidences.double(), caps, sps, base_tokens=base_tokens)

    monkeypatch.setattr(draft_stage, "schedule", anticipating)
    engine = Engine(
        target,
        TargetDrafter(target, favoured),
        EngineConfig(payoff=False, policy="prefix", max_batch=1),  # every round drafts
        sps=APPENDIX_A_SPS,
    )
    tokens = first_tokens(engine, prompt, 160, params)
    in_favoured = torch.tensor([int(t) in favoured for t in tokens]).double().mean()
    p_fav = float(p_t[sorted(favoured)].sum())
    # Appendix A: favoured first drafts are always verified (and accepted: p_d = p_t),
    # the others never, so P(favoured) = p + (1 - p) p instead of p.
    assert float(in_favoured) > p_fav + 0.1
    assert distribution_pvalue(tokens, p_t, buckets, 8) < 1e-3
