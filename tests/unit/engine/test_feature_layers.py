"""Feature layers are an argument of the target forward, not state a drafter load changes.

A shipped drafter reads layers 1, 3, 5, 7, 9 of the embedded tiny target; here the
adapter's default is another list. Loading must leave the adapter alone, and decoding
must still feed the drafter its own layers: the rounds then accept exactly what they
accept on an adapter whose default is the drafter's list (wrong layers would change τ).
"""

from __future__ import annotations

import pytest
import torch

from dspark.engine import Engine, EngineConfig
from dspark.formats.build import build_drafter
from dspark.presets.tiny import tiny_target_dir
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter

OTHER = (0, 2, 4, 6, 8)  # as many layers as the drafter reads: wrong ones would fit silently
SHIPPED = (1, 3, 5, 7, 9)


@pytest.fixture(scope="module")
def targets() -> tuple[TargetAdapter, TargetAdapter]:
    path = str(tiny_target_dir())
    return (
        TargetAdapter.from_pretrained(path, target_layer_ids=OTHER),
        TargetAdapter.from_pretrained(path, target_layer_ids=SHIPPED),
    )


def _decode(target, drafter, prompt: list[int]):
    engine = Engine(
        target,
        drafter,
        EngineConfig(payoff=False, block_size=7, policy="fixed", max_batch=1, max_seq_len=160),
    )
    rid = engine.submit(prompt, SamplingParams(temperature=0.0, max_tokens=48))
    while engine.has_work():
        engine.step()
    return engine.pop_result(rid)


def test_forward_returns_the_requested_layers(targets):
    other, shipped = targets
    ids = torch.tensor([[5, 17, 42, 9, 77, 3]])
    asked = other.forward(ids, other.new_cache(), layer_ids=SHIPPED)
    default = shipped.forward(ids, shipped.new_cache())
    assert asked.layer_ids == default.layer_ids == SHIPPED
    torch.testing.assert_close(asked.features, default.features)
    assert other.forward(ids, other.new_cache()).layer_ids == OTHER  # None: the adapter's default
    assert other.forward(ids, other.new_cache(), with_features=False).features is None


@pytest.mark.parametrize("name", ["dspark", "eagle3"])
def test_loading_leaves_the_target_alone_and_decoding_uses_the_drafters_layers(targets, name):
    other, shipped = targets
    drafter = build_drafter(name, other)
    assert other.target_layer_ids == OTHER  # not switched to the drafter's
    assert drafter.target_layer_ids == SHIPPED
    prompt = other.tokenizer("def add(a, b):\n    return")["input_ids"]
    got = _decode(other, drafter, prompt)
    want = _decode(shipped, build_drafter(name, shipped), prompt)
    assert got.token_ids == want.token_ids
    assert [r.accepted for r in got.rounds] == [r.accepted for r in want.rounds]
    assert sum(r.accepted for r in got.rounds) > 0  # the check has teeth: drafts were accepted


def test_engine_refuses_a_drafter_reading_layers_the_target_lacks(targets):
    other, _ = targets

    class Reader:
        target_layer_ids = (99,)

    with pytest.raises(ValueError, match="out of range"):
        Engine(
            other,
            Reader(),
            EngineConfig(payoff=False, block_size=7, policy="fixed", max_batch=1, max_seq_len=64),
        )
