"""No request can kill the engine (DESIGN §10).

Fuzz: prompts of 1, 2, γ, γ + 1 tokens and up to the context limit, with every drafter,
payoff control on and off, in one continuous batch: every request finishes, greedy output
is plain greedy decoding's. A one-token prompt has no prefill rows, so its first target
features arrive only as deferred rows; a drafter that read ``state.features`` then found
None and the exception ended the engine's step loop for every request.

Isolation: a drafter that raises for one request (a real drafter with one request's
context poisoned) fails that request alone; the batch beside it finishes as it would
alone, and the engine serves the next request.
"""

from __future__ import annotations

import pytest
import torch

from dspark.drafters.ngram import NgramDrafter
from dspark.engine import Engine, EngineConfig
from dspark.protocols import SamplingParams, SequenceState

from .conftest import VOCAB, greedy_references
from .test_engine_drafters import build

K = 4  # γ
CONTEXT = 64  # tokens per KV slot: the limit the last prompt fills


def drafter_for(name: str, target):
    if name == "none":
        return None
    if name == "ngram":
        return NgramDrafter(VOCAB)
    return build(name, target)


def fuzz_prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(40)
    lengths = [1, 2, K, K + 1, CONTEXT - 2]
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("payoff", [True, False], ids=["payoff", "static"])
@pytest.mark.parametrize("name", ["none", "ngram", "dflash", "dspark", "eagle3"])
def test_every_prompt_length_finishes_with_plain_greedy_output(target, sps, name, payoff):
    prompts = fuzz_prompts()
    refs = greedy_references(target, prompts, 12)
    config = EngineConfig(block_size=K, policy="fixed", max_batch=3, max_seq_len=CONTEXT, payoff=payoff)
    engine = Engine(target, drafter_for(name, target), config, sps=sps)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    results = engine.generate(prompts, params)  # raises if any request failed
    for prompt, (ref, gap), result in zip(prompts, refs, results):
        room = CONTEXT - len(prompt)  # the longest prompt leaves room for one token
        assert result.finish_reason == "length"
        assert len(result.token_ids) == min(12, room)
        if gap > 1e-3:  # a near-tie may flip under batched rounding
            assert result.token_ids == ref[: len(result.token_ids)]
    assert not engine.has_work() and engine.kv.num_free == 3


@pytest.mark.parametrize("payoff", [True, False], ids=["payoff", "static"])
def test_one_token_prompt_at_temperature_one(target, sps, payoff):
    config = EngineConfig(block_size=K, policy="fixed", max_batch=2, payoff=payoff)
    engine = Engine(target, build("dspark", target), config, sps=sps)
    (result,) = engine.generate([[7]], SamplingParams(temperature=1.0, max_tokens=10, seed=3))
    assert result.finish_reason == "length" and len(result.token_ids) == 10


class FailingFor:
    """A real drafter that raises while drafting for any request whose prompt starts with ``poison``."""

    def __init__(self, drafter, poison: int):
        self.drafter, self.poison = drafter, poison
        self.target_layer_ids = drafter.target_layer_ids
        self.block_size = drafter.block_size

    def propose(self, states, max_len, sampling):
        if any(s.token_ids[0] == self.poison for s in states):
            raise RuntimeError("drafter bug")
        return self.drafter.propose(states, max_len, sampling)

    def update(self, state, num_accepted, new_features):
        self.drafter.update(state, num_accepted, new_features)


def test_a_request_whose_drafting_raises_fails_alone_and_the_engine_serves_on(target, sps):
    poison = 99
    clean, bad = [5, 6, 7, 8, 5, 6, 7, 8], [poison, 6, 7, 8, 5, 6, 7, 8]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    config = EngineConfig(payoff=False, block_size=K, policy="fixed", max_batch=4)
    drafter = FailingFor(build("dflash", target), poison)
    with pytest.raises(RuntimeError, match="drafter bug"):  # the negative control: it does raise
        drafter.propose([SequenceState(0, bad, len(bad))], K, [params])

    engine = Engine(target, drafter, config, sps=sps)
    ids = [engine.submit(p, params) for p in (clean, bad, clean)]
    while engine.has_work():
        engine.step()
    first, failed, second = (engine.pop_result(i) for i in ids)
    assert failed.finish_reason == "error" and "drafter bug" in failed.error
    (alone,) = Engine(target, build("dflash", target), config, sps=sps).generate([clean], params)
    assert first.token_ids == second.token_ids == alone.token_ids  # untouched by their neighbour
    assert engine.kv.num_free == 4
    (after,) = engine.generate([clean], params)  # the engine still serves
    assert after.token_ids == alone.token_ids


def test_a_request_whose_commit_raises_fails_alone(target, sps):
    params = SamplingParams(temperature=0.0, max_tokens=12)
    config = EngineConfig(block_size=K, policy="fixed", max_batch=2, payoff=True)
    engine = Engine(target, build("dspark", target), config, sps=sps)

    def broken_stream(tokens):
        raise BrokenPipeError("client went away")

    good = engine.submit([5, 6, 7, 8], params)
    bad = engine.submit([5, 6, 7, 8], params, on_tokens=broken_stream)
    while engine.has_work():
        engine.step()
    assert engine.pop_result(bad).finish_reason == "error"
    result = engine.pop_result(good)
    assert result.finish_reason == "length" and len(result.token_ids) == 12
    assert engine.kv.num_free == 2


def test_an_engine_with_slots_too_small_to_profile_profiles_on_its_own(target, tmp_path):
    # a one-request ``generate`` sizes its slot to the request: 1 prompt token + 4 new < γ + 1
    engine = Engine(
        target,
        build("dspark", target),
        EngineConfig(
            block_size=7,
            policy="fixed",
            max_batch=1,
            max_seq_len=5,
            payoff=True,
            sps_path=tmp_path / "s.json",
        ),
    )
    assert engine.sps.meta["context"] > 5  # priced at the standard context, not the slot's
    (result,) = engine.generate([[9]], SamplingParams(temperature=0.0, max_tokens=4))
    assert len(result.token_ids) == 4
