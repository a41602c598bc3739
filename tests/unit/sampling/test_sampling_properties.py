"""Property tests (hypothesis) of the sampling functions over random shapes and inputs."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark.protocols import SamplingParams
from dspark.sampling.probs import process_logits
from dspark.sampling.rejection import acceptance_probability, residual_distribution, verify

SETTINGS = settings(max_examples=80, deadline=None)


def random_dist(R: int, K: int, V: int, g: torch.Generator, sparse: bool) -> torch.Tensor:
    """Distributions ``[R, K, V]``, optionally with zeros (as after top-k/top-p)."""
    logits = 3 * torch.randn(R, K, V, generator=g)
    if sparse:
        drop = torch.rand(R, K, V, generator=g) < 0.5
        drop &= logits < logits.amax(-1, keepdim=True)  # keep at least the argmax
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


@st.composite
def rounds(draw):
    R, K, V = draw(st.integers(1, 6)), draw(st.integers(0, 5)), draw(st.integers(1, 12))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    target = random_dist(R, K + 1, V, g, sparse=draw(st.booleans()))  # [R, K+1, V]
    draft = random_dist(R, K, V, g, sparse=draw(st.booleans()))  # [R, K, V]
    tokens = torch.zeros(R, K, dtype=torch.long)
    if K:
        tokens = torch.multinomial(draft.view(-1, V), 1, generator=g).view(R, K)
    if draw(st.booleans()):  # a deterministic drafter reports one-hot rows
        draft = torch.nn.functional.one_hot(tokens, V).float()
    lengths = torch.tensor(draw(st.lists(st.integers(0, K), min_size=R, max_size=R)))
    greedy = torch.tensor(draw(st.lists(st.booleans(), min_size=R, max_size=R)))
    return tokens, lengths, draft, target, greedy, g


@SETTINGS
@given(rounds())
def test_verify_emits_in_range_tokens_the_target_allows(case):
    tokens, lengths, draft, target, greedy, g = case
    R, K = tokens.shape
    V = target.shape[-1]
    out = verify(tokens, lengths, draft, target, greedy=greedy, generators=g)
    assert out.num_accepted.dtype == torch.long and out.next_tokens.dtype == torch.long
    assert ((out.num_accepted >= 0) & (out.num_accepted <= lengths)).all()
    assert ((out.next_tokens >= 0) & (out.next_tokens < V)).all()
    for r in range(R):
        n = int(out.num_accepted[r])
        emitted = out.emitted(tokens, r)
        assert len(emitted) == n + 1 <= int(lengths[r]) + 1  # exactly one recovered-or-bonus token
        assert emitted[-1] == out.next_tokens[r]
        for k, token in enumerate(emitted):  # every emitted token is possible under the target
            assert target[r, k, token] > 0
        if greedy[r]:
            assert emitted == target[r, : n + 1].argmax(-1).tolist()


@SETTINGS
@given(
    st.integers(1, 16),
    st.integers(0, 2**31 - 1),
    st.booleans(),
    st.booleans(),
)
def test_residual_is_a_distribution_inside_the_target_support(V, seed, sparse, equal):
    g = torch.Generator().manual_seed(seed)
    p_t = random_dist(4, 1, V, g, sparse).squeeze(1)  # [4, V]
    p_d = p_t.clone() if equal else random_dist(4, 1, V, g, sparse).squeeze(1)
    residual = residual_distribution(p_t, p_d)
    assert torch.isfinite(residual).all() and (residual >= 0).all()
    torch.testing.assert_close(residual.sum(-1), torch.ones(4))
    assert (residual[p_t == 0] == 0).all()
    torch.testing.assert_close(acceptance_probability(p_t, p_d), torch.minimum(p_t, p_d).sum(-1))


params_strategy = st.builds(
    SamplingParams,
    temperature=st.one_of(st.just(0.0), st.floats(0.05, 5.0)),
    top_k=st.integers(0, 20),
    top_p=st.floats(0.01, 1.0),
)
logits_strategy = st.integers(1, 16).flatmap(
    lambda V: st.lists(st.lists(st.floats(-30, 30, width=32), min_size=V, max_size=V), min_size=1, max_size=3)
)


@SETTINGS
@given(logits_strategy, params_strategy)
def test_process_logits_gives_distributions_honouring_top_k_and_top_p(rows, params):
    logits = torch.tensor(rows)  # [N, V]
    probs = process_logits(logits, params)
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(rows)))
    assert (probs[torch.arange(len(rows)), logits.argmax(-1)] > 0).all()  # the argmax survives
    if params.top_k:
        assert ((probs > 0).sum(-1) <= params.top_k).all()
    if params.greedy:
        return
    for row, p in zip(logits, probs):
        keep = p > 0
        full = torch.softmax(row / params.temperature, dim=-1)
        # Kept tokens keep their relative probabilities.
        torch.testing.assert_close(p[keep], full[keep] / full[keep].sum(), atol=1e-5, rtol=1e-4)
        if params.top_p < 1:  # the kept set is the smallest with enough mass
            k = params.top_k or row.numel()
            top = full.sort(descending=True).values[:k]
            mass = full[keep].sum() / top.sum()
            assert mass >= params.top_p - 1e-5
            assert mass - full[keep].min() / top.sum() < params.top_p + 1e-5
