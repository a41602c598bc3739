"""Deterministic cases of ``verify`` (DESIGN §3): one-hot targets, greedy, bonus indexing,
padding, seeded generators, and the helpers."""

from __future__ import annotations

import pytest
import torch

from dspark.sampling.rejection import (
    VerifyOutput,
    acceptance_probability,
    one_hot_residual,
    residual_distribution,
    sample_inverse_cdf,
    verify,
)


def one_hot(tokens: torch.Tensor, V: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(tokens, V).float()


def random_probs(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(2 * torch.randn(*shape, generator=g), dim=-1)


def test_one_hot_target_accepts_the_matching_prefix_then_emits_the_target_token():
    V, K = 10, 4
    want = torch.tensor([[1, 2, 3, 4, 5]] * 4)  # [R, K+1]: the token the target insists on
    drafts = torch.tensor(
        [
            [1, 2, 3, 4],  # all match -> bonus want[4]
            [1, 2, 9, 4],  # mismatch at 2 -> recovered want[2]
            [0, 2, 3, 4],  # mismatch at 0
            [1, 2, 3, 0],  # all match within length 2 -> bonus want[2]
        ]
    )
    lengths = torch.tensor([4, 4, 4, 2])
    p_d = random_probs(4, K, V, seed=0)  # any drafter: a one-hot target decides alone
    out = verify(drafts, lengths, p_d, one_hot(want, V), generators=torch.Generator().manual_seed(0))
    assert out.num_accepted.tolist() == [4, 2, 0, 2]
    assert out.next_tokens.tolist() == [5, 3, 1, 3]
    assert out.emitted(drafts, 1) == [1, 2, 3]


def test_all_accepted_takes_the_bonus_from_row_lengths_and_ignores_everything_after():
    V, K = 16, 4
    R = K + 1
    lengths = torch.arange(R)  # 0..K
    rows = torch.arange(K + 1) + 1  # position k: the only possible token is k + 1
    target = one_hot(rows, V).expand(R, K + 1, V).clone()  # [R, K+1, V]
    drafts = rows[:K].expand(R, K).clone()  # [R, K]
    for r in range(R):  # poison what must be ignored: padding drafts and rows after the bonus
        drafts[r, lengths[r] :] = 10**6
        target[r, lengths[r] + 1 :] = float("nan")
    p_d = one_hot(rows[:K], V).expand(R, K, V)
    out = verify(drafts, lengths, p_d, target)
    assert torch.equal(out.num_accepted, lengths)
    assert torch.equal(out.next_tokens, lengths + 1)


def test_greedy_accepts_while_draft_is_argmax_and_needs_no_draft_probs():
    V, K = 8, 3
    target = random_probs(3, K + 1, V, seed=1)  # any target: only its argmax matters
    argmax = target.argmax(-1)  # [R, K+1]
    drafts = argmax[:, :K].clone()
    drafts[0, 1] = (drafts[0, 1] + 1) % V  # mismatch at 1
    lengths = torch.tensor([3, 3, 2])  # request 1 all accepted; request 2 all accepted within 2
    out = verify(drafts, lengths, None, target, greedy=torch.ones(3, dtype=torch.bool))
    assert out.num_accepted.tolist() == [1, 3, 2]
    assert out.next_tokens.tolist() == [argmax[0, 1], argmax[1, 3], argmax[2, 2]]


def test_greedy_and_sampled_requests_mix_in_one_batch():
    V, K, R = 8, 3, 64
    target = random_probs(R, K + 1, V, seed=2)
    p_d = random_probs(R, K, V, seed=3)
    greedy = torch.arange(R) % 2 == 0
    drafts = torch.multinomial(p_d.view(-1, V), 1, generator=torch.Generator().manual_seed(4)).view(R, K)
    p_d[greedy] = float("nan")  # greedy requests must not read their draft distributions
    lengths = torch.full((R,), K)
    out = verify(drafts, lengths, p_d, target, greedy=greedy, generators=torch.Generator().manual_seed(5))
    for r in greedy.nonzero().flatten().tolist():
        matches = (drafts[r] == target[r, :K].argmax(-1)).long().cumprod(0).sum()
        assert out.num_accepted[r] == matches
        assert out.next_tokens[r] == target[r, matches].argmax()
    sampled = ~greedy
    assert (out.next_tokens[sampled] >= 0).all() and (out.next_tokens[sampled] < V).all()


def _batch(R: int, K: int, V: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(R, K + 1, V, generator=g), dim=-1)
    p_d = torch.softmax(torch.randn(R, K, V, generator=g), dim=-1)
    drafts = torch.multinomial(p_d.view(-1, V), 1, generator=g).view(R, K)
    lengths = torch.randint(0, K + 1, (R,), generator=g)
    return drafts, lengths, p_d, target


def test_per_request_generators_are_reproducible_and_independent_of_the_batch():
    R, K, V = 12, 5, 32
    drafts, lengths, p_d, target = _batch(R, K, V, seed=0)
    seeds = list(range(100, 100 + R))

    def gens(order):
        return [torch.Generator().manual_seed(seeds[r]) for r in order]

    full = verify(drafts, lengths, p_d, target, generators=gens(range(R)))
    again = verify(drafts, lengths, p_d, target, generators=gens(range(R)))
    assert torch.equal(full.num_accepted, again.num_accepted)
    assert torch.equal(full.next_tokens, again.next_tokens)

    perm = torch.randperm(R, generator=torch.Generator().manual_seed(1))
    shuffled = verify(drafts[perm], lengths[perm], p_d[perm], target[perm], generators=gens(perm.tolist()))
    assert torch.equal(shuffled.num_accepted, full.num_accepted[perm])
    assert torch.equal(shuffled.next_tokens, full.next_tokens[perm])

    for r in range(R):  # alone, with K cut to its own length: same result, same generator state
        n = int(lengths[r])
        g_alone, g_batch = gens([r])[0], gens([r])[0]
        one = slice(r, r + 1)
        alone = verify(
            drafts[one, :n], lengths[one], p_d[one, :n], target[one, : n + 1], generators=[g_alone]
        )
        assert alone.num_accepted.item() == full.num_accepted[r]
        assert alone.next_tokens.item() == full.next_tokens[r]
        others = [torch.Generator().manual_seed(0) for _ in range(R)]
        others[r] = g_batch
        verify(drafts, lengths, p_d, target, generators=others)
        assert torch.equal(torch.rand(3, generator=g_alone), torch.rand(3, generator=g_batch))


def test_shared_generator_is_reproducible():
    drafts, lengths, p_d, target = _batch(64, 4, 16, seed=1)
    a = verify(drafts, lengths, p_d, target, generators=torch.Generator().manual_seed(3))
    b = verify(drafts, lengths, p_d, target, generators=torch.Generator().manual_seed(3))
    assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.next_tokens, b.next_tokens)


def test_shapes_are_checked_at_the_boundary():
    drafts, lengths, p_d, target = _batch(4, 3, 8, seed=2)
    with pytest.raises(AssertionError, match="target_probs"):
        verify(drafts, lengths, p_d, target[:, :3])
    with pytest.raises(AssertionError, match="draft_probs"):
        verify(drafts, lengths, p_d[:, :2], target)
    with pytest.raises(AssertionError, match="draft_lengths"):
        verify(drafts, lengths + 4, p_d, target)


def test_emitted_lists_accepted_drafts_then_the_next_token():
    out = VerifyOutput(num_accepted=torch.tensor([0, 2]), next_tokens=torch.tensor([7, 9]))
    drafts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert out.emitted(drafts, 0) == [7]
    assert out.emitted(drafts, 1) == [4, 5, 9]


def test_residual_distribution_and_acceptance_identity():
    p_t = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]])
    p_d = torch.tensor([[0.2, 0.3, 0.1, 0.4], [0.25, 0.25, 0.25, 0.25]])
    residual = residual_distribution(p_t, p_d)
    torch.testing.assert_close(residual[0], torch.tensor([0.75, 0.0, 0.25, 0.0]))
    torch.testing.assert_close(residual[1], p_t[1])  # p_t == p_d: falls back to p_t
    torch.testing.assert_close(acceptance_probability(p_t, p_d), torch.tensor([0.6, 1.0]))


def test_inverse_cdf_never_returns_a_token_without_mass():
    probs = torch.tensor([[0.0, 2.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0, 0.0]])
    for u, expected in [(0.0, [1, 4, 0]), (0.5, [3, 4, 0]), (1 - 2**-53, [3, 4, 0]), (1.0, [3, 4, 0])]:
        tokens = sample_inverse_cdf(probs, torch.full((3,), u, dtype=torch.float64))
        assert tokens.tolist() == expected, u


@pytest.mark.parametrize("seed", range(4))
def test_no_draft_probs_means_one_hot_at_the_drafts(seed):
    """``draft_probs=None`` (a deterministic proposer) verifies exactly as the one-hot rows would,
    draw for draw, for sampled and greedy requests mixed, with any lengths."""
    R, K, V = 6, 4, 12
    g = torch.Generator().manual_seed(seed)
    greedy = torch.tensor([False, False, True, False, True, False])
    outcomes = set()
    for trial in range(20):
        target = random_probs(R, K + 1, V, seed=seed * 100 + trial)
        drafts = torch.randint(0, V, (R, K), generator=g)
        drafts[:, :2] = target[:, :2].argmax(-1)  # likely drafts first, so rounds get past them
        drafts[0] = target[0, :K].argmax(-1)
        target[0, :2] = one_hot(drafts[0, :2], V)  # p_t(x) = 1: accepted whatever the draw
        lengths = torch.randint(0, K + 1, (R,), generator=g)

        def run(draft_probs, drafts=drafts, lengths=lengths, target=target):
            generators = [torch.Generator().manual_seed(10 + r) for r in range(R)]
            return verify(drafts, lengths, draft_probs, target, greedy=greedy, generators=generators)

        explicit, implicit = run(one_hot(drafts, V)), run(None)
        assert torch.equal(explicit.num_accepted, implicit.num_accepted)
        assert torch.equal(explicit.next_tokens, implicit.next_tokens)
        assert int(implicit.num_accepted[0]) >= min(2, int(lengths[0]))
        outcomes.update((int(n) < int(m)) for n, m in zip(implicit.num_accepted, lengths))
    assert outcomes == {True, False}  # both rejections (residual draws) and full acceptances


def test_one_hot_residual_drops_the_draft_and_keeps_a_certain_target():
    p_t = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 1.0, 0.0, 0.0]])
    x = torch.tensor([[0], [1]])
    expected = torch.tensor([[0.0, 0.6, 0.4, 0.0], [0.0, 1.0, 0.0, 0.0]])  # row 2: p_t(x) = 1
    torch.testing.assert_close(one_hot_residual(p_t, x), expected)
    torch.testing.assert_close(one_hot_residual(p_t, x), residual_distribution(p_t, one_hot(x[:, 0], 4)))


def test_greedy_verification_reads_the_raw_logits_argmax():
    """The engine verifies greedy batches from ``logits.argmax`` without probabilities: the same
    outcome as the processed one-hot rows, ties to the lowest id included."""
    from dspark.protocols import SamplingParams
    from dspark.sampling import batch_probs, verify_greedy

    R, K, V = 5, 3, 9
    logits = torch.randn(R, K + 1, V, generator=torch.Generator().manual_seed(3))
    logits[1, 0, 4] = logits[1, 0, 6] = logits[1, 0].max() + 1  # a tie: 4 wins
    drafts = logits[:, :K].argmax(-1)
    drafts[2, 1] = (drafts[2, 1] + 1) % V  # request 2 is rejected at 1
    lengths = torch.tensor([3, 3, 3, 1, 0])
    probs = batch_probs(logits, [SamplingParams(temperature=0.0)] * R)
    general = verify(drafts, lengths, None, probs, greedy=torch.ones(R, dtype=torch.bool))
    fast = verify_greedy(drafts, lengths, logits.argmax(-1))
    assert torch.equal(fast.num_accepted, general.num_accepted)
    assert torch.equal(fast.next_tokens, general.next_tokens)
    assert fast.num_accepted.tolist() == [3, 3, 1, 1, 0] and int(fast.next_tokens[1]) == int(
        logits[1, 3].argmax()
    )
