"""DSpark's cheaper batch-1 round (issue 17) drafts exactly what the per-step loop drafted.

The reference (``bench/round_cost.py: per_step_loop``) is the loop as it was: every step
processes ``U_k + B_k`` through ``batch_probs`` (one-hot at the argmax when greedy), draws
with ``sample_tokens`` and computes that step's confidence. The greedy path now keeps only
the argmax per step and computes the confidences of the whole block at once; tokens must
be bitwise equal (its one-hot probabilities are no longer built), confidences equal to
rounding; sampled probabilities bitwise equal.
"""

from __future__ import annotations

import pytest
import torch

from dspark.bench.round_cost import per_step_loop
from dspark.protocols import SamplingParams

from .builders import BLOCK, build, make_state, prompt

GREEDY = SamplingParams(temperature=0.0)


def reference_round(drafter, states, sampling):
    """The per-step loop of DSpark's ``propose`` before issue 17: tokens, probs, confidences."""
    generators = drafter.backbone.prepare(states, sampling)
    h = drafter.backbone.block_hidden_infer(states)[:, :BLOCK]
    prev = torch.tensor([s.token_ids[-1] for s in states])
    return per_step_loop(drafter, h, drafter.backbone.logits(h), prev, sampling, generators)


@pytest.mark.parametrize("name", ["dspark_markov", "dspark_rnn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_round_equals_the_per_step_loop(target, name, dtype, batch):
    drafter = build(name, target, sts_temperatures=(1.5, 2.0)).to(dtype)
    # a head strong enough that the bias decides most drafts (the loop must feed x_k back)
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.mul_(8.0)
    contexts = [prompt(9 + 2 * r, seed=r) for r in range(batch)]
    fast = drafter.propose(
        [make_state(target, c, r) for r, c in enumerate(contexts)], BLOCK, [GREEDY] * batch
    )
    tokens, probs, conf = reference_round(
        drafter, [make_state(target, c, r) for r, c in enumerate(contexts)], [GREEDY] * batch
    )
    assert torch.equal(fast.tokens, tokens)
    # one-hot at the tokens, reported without probabilities (protocols.DraftBlock)
    assert fast.probs is None and torch.equal(probs.argmax(-1), tokens) and bool((probs.amax(-1) == 1).all())
    torch.testing.assert_close(
        fast.confidences, conf, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-6
    )
    # the head mattered: the drafts are not those of the backbone alone
    first = [make_state(target, contexts[0])]
    drafter.backbone.prepare(first, [GREEDY])
    h = drafter.backbone.block_hidden_infer(first)[:, :BLOCK]
    assert not torch.equal(drafter.backbone.logits(h).argmax(-1), fast.tokens[:1])


def test_sampled_round_is_the_per_step_loop(target):
    """Seeded sampling still draws step by step from the reported distribution, as before."""
    drafter = build("dspark_markov", target)
    sampled = [SamplingParams(temperature=1.0, top_k=5, seed=11)]
    fast = drafter.propose([make_state(target, prompt(9))], BLOCK, sampled)
    tokens, probs, conf = reference_round(drafter, [make_state(target, prompt(9))], sampled)
    assert torch.equal(fast.tokens, tokens) and torch.equal(fast.probs, probs)
    torch.testing.assert_close(fast.confidences, conf)
