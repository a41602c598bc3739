"""``propose`` returns a valid DraftBlock sampled from the distribution it reports (DESIGN §3, §5)."""

from __future__ import annotations

import pytest
import torch

from dspark.protocols import DraftBlock, Drafter, SamplingParams

from .builders import BLOCK, build, make_state, prompt

SAMPLED = SamplingParams(temperature=1.0, seed=7)
GREEDY = SamplingParams(temperature=0.0)


def has_confidences(drafter) -> bool:
    return getattr(drafter, "confidence_head", None) is not None


@pytest.mark.parametrize("max_len", [1, 3, 9])
def test_block_is_valid(target, drafter, max_len):
    state = make_state(target, prompt(9))
    block = drafter.propose([state], max_len, [SAMPLED])
    K = min(max_len, BLOCK)
    assert isinstance(drafter, Drafter) and drafter.block_size == BLOCK
    assert isinstance(block, DraftBlock)
    assert block.tokens.shape == (1, K) and block.tokens.dtype == torch.long
    assert block.lengths.tolist() == [K]
    assert block.probs.shape == (1, K, target.vocab_size)
    torch.testing.assert_close(block.probs.sum(-1), torch.ones(1, K))
    assert bool((block.probs.gather(-1, block.tokens.unsqueeze(-1)) > 0).all()), "a token of probability 0"
    if has_confidences(drafter):
        assert block.confidences.shape == (1, K)
        assert bool(((block.confidences > 0) & (block.confidences < 1)).all())
    else:
        assert block.confidences is None


def test_zero_max_len_is_an_empty_block(target, drafter):
    block = drafter.propose([make_state(target, prompt(5))], 0, [SAMPLED])
    assert block.tokens.shape == (1, 0) and block.lengths.tolist() == [0]


def test_greedy_is_argmax_one_hot(target, drafter):
    """All greedy: the drafts the general path draws for a greedy row (one-hot rows), no probs built."""
    block = drafter.propose([make_state(target, prompt(9))], BLOCK, [GREEDY])
    assert block.probs is None
    mixed = drafter.propose(
        [make_state(target, prompt(9)), make_state(target, prompt(9), 1)],
        BLOCK,
        [GREEDY, SamplingParams(seed=1)],
    )
    assert torch.equal(mixed.probs[0].max(-1).values, torch.ones(BLOCK))
    assert torch.equal(mixed.tokens[:1], mixed.probs[:1].argmax(-1))
    assert torch.equal(block.tokens, mixed.tokens[:1])


def test_seeded_sampling_is_reproducible(target, drafter):
    def draft(seed):
        return drafter.propose([make_state(target, prompt(9))], BLOCK, [SamplingParams(seed=seed)]).tokens

    assert torch.equal(draft(3), draft(3))
    assert any(not torch.equal(draft(3), draft(s)) for s in (4, 5, 6))


def test_tokens_follow_the_reported_distribution(target):
    """First draft of DSpark under top-k 3: empirical frequencies match ``probs`` (4 sigma)."""
    drafter = build("dspark_markov", target)
    state = make_state(target, prompt(9))
    params = SamplingParams(temperature=1.0, top_k=3, seed=0)
    n = 400
    first = [drafter.propose([state], 1, [params]) for _ in range(n)]  # same state: same p_1
    probs = first[0].probs[0, 0]
    counts = torch.bincount(torch.cat([b.tokens[0] for b in first]), minlength=probs.numel()).float()
    assert int((probs > 0).sum()) == 3 and bool((counts[probs == 0] == 0).all())
    assert float((counts / n - probs).abs().max()) < 4 * (0.25 / n) ** 0.5


def test_batch_equals_one_by_one(target, drafter):
    """R = 2 requests with different context lengths (padded) = each request alone."""
    lengths = (6, 11)
    params = [SamplingParams(seed=1), SamplingParams(temperature=0.7, top_p=0.9, seed=2)]
    batched = drafter.propose(
        [make_state(target, prompt(n, seed=n), r) for r, n in enumerate(lengths)], BLOCK, params
    )
    for r, n in enumerate(lengths):
        alone = drafter.propose([make_state(target, prompt(n, seed=n), r)], BLOCK, [params[r]])
        torch.testing.assert_close(batched.probs[r], alone.probs[0], atol=1e-5, rtol=1e-5)
        assert torch.equal(batched.tokens[r], alone.tokens[0])
        if has_confidences(drafter):
            torch.testing.assert_close(batched.confidences[r], alone.confidences[0], atol=1e-5, rtol=1e-5)


def test_sts_temperatures_scale_confidence_logits(target):
    state_args = (target, prompt(9))
    raw = build("dspark_markov", target).propose([make_state(*state_args)], BLOCK, [GREEDY]).confidences
    temps = (2.0, 0.5, 1.0, 4.0)
    scaled = build("dspark_markov", target, sts_temperatures=temps)
    conf = scaled.propose([make_state(*state_args)], BLOCK, [GREEDY]).confidences
    torch.testing.assert_close(
        torch.logit(conf), torch.logit(raw) / torch.tensor(temps), atol=1e-4, rtol=1e-4
    )
