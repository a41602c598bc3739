"""Greedy output of the batched engine equals plain greedy decoding, token for token (DESIGN §3, §10).

Every policy, batch sizes 1, 8 and 32, requests joining mid-flight and waiting in the
queue, EOS and ``max_tokens`` landing inside accepted blocks, chunked prefill.
"""

from __future__ import annotations

import pytest

from dspark.decoding import speculative_generate
from dspark.drafters.ngram import NgramDrafter
from dspark.engine import Engine, EngineConfig
from dspark.protocols import SamplingParams

from .conftest import VOCAB, greedy_references, make_prompts
from .drafters import NoisyOracleDrafter

POLICIES = ["fixed", "fixed:1", "threshold:0.5", "prefix", "prefix-async"]
MAX_NEW = 40


@pytest.fixture(scope="module")
def cases(target):
    """32 prompts with comfortable greedy margins, their references, and per-request max_tokens."""
    prompts, refs = [], {}
    candidates = make_prompts(40, seed=11)
    for prompt, (ref, gap) in zip(candidates, greedy_references(target, candidates, MAX_NEW)):
        # Batched and single forwards differ by ~1e-6; keep prompts whose greedy path is
        # not decided by a near-tie, so the comparison tests the engine, not rounding.
        if gap > 1e-3 and tuple(prompt) not in refs:
            prompts.append(prompt)
            refs[tuple(prompt)] = ref
    assert len(prompts) >= 32
    prompts = prompts[:32]
    max_tokens = [5 + (7 * i) % (MAX_NEW - 4) for i in range(32)]  # 5 .. 40, cutting inside blocks
    return prompts, refs, max_tokens


def run_engine(engine: Engine, prompts, params, *, join_after: int) -> list[list[int]]:
    """Submit half the prompts, step ``join_after`` times, submit the rest, run to completion."""
    half = (len(prompts) + 1) // 2
    ids = [engine.submit(p, sp) for p, sp in zip(prompts[:half], params[:half])]
    for _ in range(join_after):
        engine.step()
    ids += [engine.submit(p, sp) for p, sp in zip(prompts[half:], params[half:])]
    while engine.has_work():
        engine.step()
    return [engine.pop_result(i) for i in ids]


def expected(ref: list[int], max_tokens: int, eos: int | None) -> list[int]:
    out = ref[:max_tokens]
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return out


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("batch,num_requests", [(1, 3), (8, 12), (32, 32)])
def test_greedy_equals_plain_greedy(target, sps, cases, policy, batch, num_requests):
    prompts, refs, max_tokens = cases
    prompts, max_tokens = prompts[:num_requests], max_tokens[:num_requests]
    # EOS = a token the references emit at various offsets: sequences end inside blocks.
    eos = refs[tuple(prompts[0])][6]
    target.eos_token_ids = (eos,)
    try:
        engine = Engine(
            target,
            NoisyOracleDrafter(refs, VOCAB),
            EngineConfig(payoff=False, policy=policy, max_batch=batch, block_size=7),
            sps=sps,
        )
        params = [SamplingParams(temperature=0.0, max_tokens=m) for m in max_tokens]
        results = run_engine(engine, prompts, params, join_after=3)
    finally:
        target.eos_token_ids = ()
    for prompt, m, result in zip(prompts, max_tokens, results):
        assert result.token_ids == expected(refs[tuple(prompt)], m, eos)
    assert engine.stats.accepted > 0, "the drafter should get drafts accepted"
    # Some rounds must end inside their block (EOS or max_tokens cut after accepted drafts).
    cut_rounds = [r for res in results for r in res.rounds if r.emitted < r.accepted + 1]
    if num_requests > 3:
        assert cut_rounds or policy == "fixed:1", "no round was cut inside an accepted block"
        assert {res.finish_reason for res in results} == {"stop", "length"}
    if batch > 1:
        assert engine.stats.max_forward_tokens > batch, "steps should verify several requests' drafts at once"


@pytest.mark.parametrize("drafter_name", ["none", "ngram"])
def test_plain_and_ngram_equal_plain_greedy(target, sps, cases, drafter_name):
    prompts, refs, _ = cases
    drafter = None if drafter_name == "none" else NgramDrafter(VOCAB)
    engine = Engine(target, drafter, EngineConfig(payoff=False, policy="prefix", max_batch=8), sps=sps)
    results = engine.generate(prompts[:16], SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    for prompt, result in zip(prompts, results):
        assert result.token_ids == refs[tuple(prompt)]
        assert result.finish_reason == "length"
    if drafter is None:
        assert engine.stats.tau == 1.0


def test_chunked_prefill_mixed_with_decode(target, sps, cases):
    """Prompts longer than the per-step prefill budget are prefilled over several steps."""
    prompts, refs, _ = cases
    long = [p for p in prompts if len(p) > 20][:4]
    engine = Engine(
        target,
        NoisyOracleDrafter(refs, VOCAB),
        EngineConfig(payoff=False, max_batch=6, prefill_chunk=7),
        sps=sps,
    )
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    results = run_engine(engine, prompts[:2] + long, [params] * 6, join_after=2)
    for prompt, result in zip(prompts[:2] + long, results):
        assert result.token_ids == refs[tuple(prompt)]
    assert engine.stats.prefill_tokens == sum(len(p) - 1 for p in prompts[:2] + long)


def test_stop_strings_cut_like_the_loop(target, cases):
    """Stop strings cut exactly as the batch-1 loop cuts them, inside accepted blocks too."""
    prompts, refs, _ = cases

    def decode(ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)

    stops = [(f"w{refs[tuple(p)][3]} w{refs[tuple(p)][4]}",) for p in prompts[:6]]
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_NEW, stop=s) for s in stops]
    engine = Engine(
        target, NoisyOracleDrafter(refs, VOCAB), EngineConfig(payoff=False, policy="fixed"), decode=decode
    )
    results = engine.generate(prompts[:6], params)
    for prompt, sp, result in zip(prompts, params, results):
        loop = speculative_generate(target, None, prompt, sp, decode=decode)
        assert result.token_ids == loop.token_ids
        assert result.text == loop.text and result.finish_reason == "stop"


def test_streamed_tokens_are_the_result(target, sps, cases):
    prompts, refs, _ = cases
    engine = Engine(target, NoisyOracleDrafter(refs, VOCAB), EngineConfig(payoff=False, max_batch=4), sps=sps)
    streamed: dict[int, list[int]] = {}
    ids = [
        engine.submit(
            p, SamplingParams(temperature=0.0, max_tokens=20), on_tokens=streamed.setdefault(i, []).extend
        )
        for i, p in enumerate(prompts[:6])
    ]
    events = []
    while engine.has_work():
        events += engine.step()
    for i, rid in enumerate(ids):
        result = engine.result(rid)
        assert streamed[i] == result.token_ids == refs[tuple(prompts[i])][:20]
        mine = [e for e in events if e.request_id == rid]
        assert sum((e.tokens for e in mine), []) == result.token_ids
        assert mine[-1].finish_reason == "length" and all(e.finish_reason is None for e in mine[:-1])


def test_queue_cancel_and_limits(target, sps, cases):
    prompts, refs, _ = cases
    engine = Engine(
        target,
        NoisyOracleDrafter(refs, VOCAB),
        EngineConfig(payoff=False, max_batch=2, max_seq_len=64),
        sps=sps,
    )
    ids = [engine.submit(p, SamplingParams(temperature=0.0, max_tokens=30)) for p in prompts[:4]]
    engine.step()
    assert engine.num_active == 2 and engine.num_queued == 2  # beyond the KV slots: queued
    engine.cancel(ids[0])
    assert engine.result(ids[0]).finish_reason == "cancelled"
    engine.step()
    assert engine.num_active == 2 and engine.num_queued == 1  # the freed slot was reused
    while engine.has_work():
        engine.step()
    for rid, prompt in zip(ids[1:], prompts[1:4]):
        assert engine.result(rid).token_ids == refs[tuple(prompt)][:30]
    with pytest.raises(Exception, match="prompt has 64 tokens"):
        engine.submit([5] * 64, SamplingParams(temperature=0.0))
    # max_tokens is clamped to what the slot holds
    result = engine.generate([prompts[0][:4]], SamplingParams(temperature=0.0, max_tokens=500))[0]
    assert len(result.token_ids) == 64 - 4 and result.finish_reason == "length"
