"""The engine behind asyncio: concurrent callers are batched, streams cancel cleanly."""

from __future__ import annotations

import asyncio

import pytest

from dspark.engine import Engine, EngineConfig
from dspark.engine.requests import RequestFailedError
from dspark.engine.worker import EngineDeadError, EngineWorker
from dspark.errors import PromptTooLongError
from dspark.protocols import SamplingParams

from .conftest import VOCAB, greedy_references, make_prompts
from .drafters import NoisyOracleDrafter

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def prompts_refs(target):
    prompts = make_prompts(8, seed=31)
    refs = greedy_references(target, prompts, 24)
    return [(p, r) for p, (r, gap) in zip(prompts, refs) if gap > 1e-3]


def test_concurrent_callers_share_batches(target, sps, prompts_refs):
    refs = {tuple(p): r for p, r in prompts_refs}
    engine = Engine(
        target,
        NoisyOracleDrafter(refs, VOCAB),
        EngineConfig(payoff=False, max_batch=8, max_seq_len=96),
        sps=sps,
    )
    worker = EngineWorker(engine)

    async def main():
        async def streamed(prompt):
            chunks = [c async for c in worker.stream(prompt, GREEDY)]
            return sum(chunks, [])

        gens = [worker.generate(p, GREEDY) for p, _ in prompts_refs]
        streams = [streamed(p) for p, _ in prompts_refs[:2]]
        return await asyncio.gather(*gens), await asyncio.gather(*streams)

    try:
        results, streamed = asyncio.run(main())
    finally:
        worker.close()
    for (_, ref), result in zip(prompts_refs, results):
        assert result.token_ids == ref
    assert streamed == [r for _, r in prompts_refs[:2]]
    assert engine.stats.steps < 2 * 24, "concurrent requests should have been decoded together"


def test_cancel_errors_and_close(target, sps, prompts_refs):
    engine = Engine(target, None, EngineConfig(payoff=False, max_batch=2, max_seq_len=64), sps=sps)
    worker = EngineWorker(engine)

    async def main():
        long = SamplingParams(temperature=0.0, max_tokens=60)
        async for _ in worker.stream(prompts_refs[0][0], long):
            break  # the caller goes away after its first tokens: the request is cancelled
        with pytest.raises(PromptTooLongError):
            await worker.generate([5] * 64, GREEDY)
        task = asyncio.ensure_future(worker.generate(prompts_refs[1][0], long))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the engine keeps serving
        return await worker.generate(prompts_refs[2][0], GREEDY)

    try:
        result = asyncio.run(main())
        assert result.token_ids == prompts_refs[2][1]
        for _ in range(100):
            if not engine.has_work():
                break
            asyncio.run(asyncio.sleep(0.01))
        assert not engine.has_work() and engine.kv.num_free == 2  # cancelled requests freed their slots
    finally:
        worker.close()
    assert not worker.alive

    async def after_close():
        await worker.generate(prompts_refs[0][0], GREEDY)

    with pytest.raises(EngineDeadError):
        asyncio.run(after_close())


def test_a_failing_drafter_fails_its_requests_and_the_engine_serves_on(target, sps, prompts_refs):
    class Broken:
        target_layer_ids: tuple[int, ...] = ()

        def propose(self, states, max_len, sampling):
            raise RuntimeError("drafter exploded")

        def update(self, state, num_accepted, new_features):
            pass

    worker = EngineWorker(
        Engine(target, Broken(), EngineConfig(payoff=False, policy="fixed", max_seq_len=64))
    )

    async def main():
        await worker.generate(prompts_refs[0][0], GREEDY)

    try:
        for _ in range(2):  # the first failure left the worker serving
            with pytest.raises(RequestFailedError, match="drafter exploded"):
                asyncio.run(main())
            assert worker.alive and worker.error is None
    finally:
        worker.close()
