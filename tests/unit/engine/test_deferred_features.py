"""Target features of rounds a lazy drafter is not told about are deferred, not copied per
request per step (issue 17's floor): what the drafter reads equals eager capture, which
equals one target forward over the committed tokens (never a re-forward in the engine)."""

from __future__ import annotations

import random

import pytest
import torch

from dspark.engine import Engine, EngineConfig
from dspark.engine.requests import DEFER_LIMIT, FeatureBuffer
from dspark.protocols import SamplingParams

from .conftest import make_prompts
from .test_engine_drafters import build


def test_deferred_rows_equal_eager_appends():
    """Any mix of appends and deferred rounds (past the deferral limit too) gives the same rows."""
    rng = random.Random(0)
    eager, lazy = FeatureBuffer(), FeatureBuffer()
    for _ in range(5 * DEFER_LIMIT):
        features = torch.randn(rng.randrange(1, 9), 3, 4)  # one step's [N, L, H]
        start = rng.randrange(features.shape[0])
        stop = rng.randrange(start + 1, features.shape[0] + 1)
        eager.append(features[start:stop])
        if rng.random() < 0.2:
            lazy.append(features[start:stop])
        else:
            lazy.defer(features, start, stop)
        assert len(lazy.pending) < DEFER_LIMIT  # bounded: the step tensors kept alive
        if rng.random() < 0.1:
            torch.testing.assert_close(lazy.rows(), eager.rows(), rtol=0, atol=0)
    torch.testing.assert_close(lazy.rows(), eager.rows(), rtol=0, atol=0)
    assert FeatureBuffer().rows() is None


@pytest.mark.parametrize("name", ["dflash", "eagle3"])
def test_a_lazy_drafter_reads_the_features_one_target_forward_gives(target, sps, name):
    """Under the speculation controller with a drafter too costly to pay (it only probes), most rounds defer
    their features; at every proposal and at the end each request's features equal those of
    one forward of the target over its committed tokens."""
    drafter = build(name, target)
    seen = []
    propose = drafter.propose

    def checked_propose(states, max_len, sampling):
        seen.extend((list(s.token_ids), s.features.clone()) for s in states)
        return propose(states, max_len, sampling)

    drafter.propose = checked_propose
    # neither pays: plain rounds, model probes only (a model that could not pay even when always
    # right, 3 s a request, would not be probed at all)
    costs = (("model", 0.5), ("ngram", 100.0))
    config = EngineConfig(policy="fixed", max_batch=4, block_size=4, payoff=True, draft_costs=costs)
    engine = Engine(target, drafter, config, sps=sps)
    ids = [engine.submit(p, SamplingParams(temperature=0.0, max_tokens=120)) for p in make_prompts(4, seed=5)]
    while engine.has_work():
        engine.step()
    assert engine.stats.model_rounds > 0 and engine.stats.plain_rounds > 3 * engine.stats.model_rounds
    finished = [engine._finished[i] for i in ids]
    assert any(r.features.pending for r in finished)  # plain rounds at the end left deferred rows
    ends = [(r.state.token_ids, r.features.rows()) for r in finished]
    for tokens, features in seen + ends:  # one row per token but the anchor (the last one)
        context = torch.tensor([tokens[:-1]])
        out = target.forward(context, target.new_cache(), layer_ids=drafter.target_layer_ids)
        torch.testing.assert_close(features, out.features[0], rtol=1e-4, atol=1e-4)


def test_state_features_are_current_after_a_full_deferral_queue_was_copied_in():
    """A request that decoded plainly for exactly ``DEFER_LIMIT`` rounds (its queue copied in,
    maybe into a grown buffer, none pending) still gets every row before the drafter reads."""
    from dspark.engine.requests import Request
    from dspark.protocols import SequenceState

    req = Request(
        id=0,
        params=SamplingParams(temperature=0.0, max_tokens=8),
        state=SequenceState(0, [1, 2, 3], 3),
        max_new=8,
        generator=None,
        on_tokens=None,
    )
    rows = torch.randn(60 + DEFER_LIMIT, 2, 3)
    req.state.features = req.features.append(rows[:60])  # a prefill, then a told round
    for i in range(DEFER_LIMIT):
        req.features.defer(rows, 60 + i, 61 + i)
    assert not req.features.pending  # copied in by the queue limit, into a grown buffer
    req.sync_features()
    torch.testing.assert_close(req.state.features, rows, rtol=0, atol=0)
