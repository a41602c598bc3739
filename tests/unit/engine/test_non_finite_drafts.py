"""A drafter that produces non-finite probabilities fails only the requests concerned (issue 15)."""

from __future__ import annotations

import pytest
import torch

from dspark.decoding import speculative_generate
from dspark.drafters.eagle3 import Eagle3Config
from dspark.drafters.kinds import KINDS
from dspark.engine import Engine, EngineConfig
from dspark.engine.requests import RequestFailedError
from dspark.errors import DsparkError
from dspark.protocols import SamplingParams

POISONED = 100  # a token whose drafter embedding row is NaN


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(0)
    d = KINDS["eagle3"].drafter_cls.from_target(target, Eagle3Config(block_size=4))
    with torch.no_grad():
        d.embed_tokens.weight[POISONED] = float("nan")
    return d


@pytest.mark.parametrize("payoff", [False, True])
def test_a_lone_request_with_non_finite_drafts_ends_with_an_error_event(target, drafter, sps, payoff):
    """Its step has nobody left to verify: the step still reports the failure (a server's stream
    waits for that event), and the next request is served."""
    config = EngineConfig(payoff=payoff, max_batch=2, block_size=4, draft_costs=(("model", 0.0),))
    engine = Engine(target, drafter, config, sps=sps)
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=3)
    rid = engine.submit([5, 6, POISONED, 7, 8], params)
    events = []
    while engine.has_work():
        events += engine.step()
    assert [e.finish_reason for e in events if e.request_id == rid][-1] == "error"
    assert "non-finite" in engine.pop_result(rid).error
    assert engine.generate([[5, 6, 7, 8, 9]], params)[0].finish_reason == "length"


def test_only_the_request_with_non_finite_drafts_fails_and_the_batch_goes_on(target, drafter):
    # a seed whose clean answer (and its drafts) never meets the poisoned token: alone, it runs
    # to its length (asserted below), so any failure beside the poisoned request is contagion
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=1)
    clean, poisoned = [3, 4, 5, 6, 7], [3, 4, POISONED, 6, 7]

    def run(prompts):
        engine = Engine(
            target, drafter, EngineConfig(payoff=False, policy="fixed", max_batch=4, block_size=4)
        )
        ids = [engine.submit(p, params) for p in prompts]
        while engine.has_work():
            engine.step()
        return [engine.pop_result(i) for i in ids], engine

    (alone,), _ = run([clean])
    assert alone.finish_reason == "length"
    (bad, good), engine = run([poisoned, clean])
    assert bad.finish_reason == "error" and "non-finite probabilities" in bad.error
    assert good.finish_reason == "length" and good.token_ids == alone.token_ids  # untouched by its neighbour
    assert engine.kv.num_free == 4 and not engine.has_work()  # the failed request gave its slot back
    assert all(torch.isfinite(torch.as_tensor(engine.estimator.position_rates())).tolist())
    with pytest.raises(RequestFailedError, match="non-finite"):
        engine.generate([poisoned], params)


def test_the_decoding_loop_stops_with_a_clear_error(target, drafter):
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=1)
    with pytest.raises(DsparkError, match="non-finite probabilities"):
        speculative_generate(target, drafter, [3, POISONED, 5], params, block_size=4)
