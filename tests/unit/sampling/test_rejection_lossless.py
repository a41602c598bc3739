"""Statistical losslessness of ``verify`` (DESIGN §3): what a round emits follows the target.

Toy design: position k of a round has its own fixed target row ``p_t[k]`` and draft row
``p_d[k]`` that do not depend on earlier tokens, and drafts are sampled from ``p_d``.
Then, given that a round reaches position j (all earlier drafts accepted), the token it
emits there must be distributed as ``p_t[j]``, whether it is an accepted draft, a
recovered token or the bonus token. Each configuration runs 100k rounds in one call.
A last test drops the independence: a Markov-chain target and drafter over several
rounds, checked on the joint of the first three generated tokens.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch

from dspark.sampling import rejection
from dspark.sampling.rejection import VerifyOutput, acceptance_probability, verify

N_ROUNDS = 100_000
ALPHA = 1e-3  # family-wise, Bonferroni over the positions of a configuration
CONFIGS = [(V, K) for V in (8, 64) for K in (1, 3, 7)]


def toy_rows(V: int, K: int, seed: int, noise: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Target rows ``[K+1, V]`` and nearby but different draft rows ``[K, V]``."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(K + 1, V, generator=g)  # a different target row per position
    p_t = torch.softmax(logits, dim=-1)
    p_d = torch.softmax(logits[:K] + noise * torch.randn(K, V, generator=g), dim=-1)
    return p_t, p_d


def toy_lengths(R: int, K: int, seed: int) -> torch.Tensor:
    """Half the requests verify all K drafts, half a uniform 0..K (bonus rows vary)."""
    g = torch.Generator().manual_seed(seed)
    short = torch.randint(0, K + 1, (R,), generator=g)
    return torch.where(torch.rand(R, generator=g) < 0.5, K, short)  # [R]


def run_rounds(
    p_t: torch.Tensor, p_d: torch.Tensor, lengths: torch.Tensor, seed: int, verify_fn=verify
) -> tuple[torch.Tensor, VerifyOutput]:
    """Sample drafts from ``p_d`` and verify them: one round for each of R requests."""
    R, (K, V) = lengths.shape[0], p_d.shape
    g = torch.Generator().manual_seed(seed)
    drafts = torch.zeros(R, K, dtype=torch.long)  # [R, K]
    for k in range(K):
        drafts[:, k] = torch.multinomial(p_d[k], R, replacement=True, generator=g)
    # expand: the rows are shared by every request, no [R, K, V] copy needed.
    out = verify_fn(drafts, lengths, p_d.expand(R, K, V), p_t.expand(R, K + 1, V), generators=g)
    return drafts, out


def emitted_at(drafts: torch.Tensor, out: VerifyOutput, j: int) -> torch.Tensor:
    """Token emitted at position j by the rounds that reached j."""
    tokens = out.next_tokens  # [R]
    if j < drafts.shape[1]:
        tokens = torch.where(j < out.num_accepted, drafts[:, j], tokens)
    return tokens[out.num_accepted >= j]


def position_pvalues(chi2_pvalue, p_t, drafts, out) -> list[float]:
    return [chi2_pvalue(emitted_at(drafts, out, j), p_t[j]) for j in range(p_t.shape[0])]


@cache
def config_run(V: int, K: int):
    p_t, p_d = toy_rows(V, K, seed=V * 10 + K)
    lengths = toy_lengths(N_ROUNDS, K, seed=K)
    drafts, out = run_rounds(p_t, p_d, lengths, seed=1234 + V + K)
    return p_t, p_d, lengths, drafts, out


@pytest.mark.parametrize("V,K", CONFIGS)
def test_emitted_token_at_each_position_follows_target_row(chi2_pvalue, V, K):
    p_t, _, _, drafts, out = config_run(V, K)
    assert int((out.num_accepted >= K).sum()) > 10_000, "toy too hard: too few rounds reach K"
    pvalues = position_pvalues(chi2_pvalue, p_t, drafts, out)
    assert min(pvalues) * len(pvalues) > ALPHA, pvalues


@pytest.mark.parametrize("V,K", CONFIGS)
def test_conditional_acceptance_matches_one_minus_tv(V, K):
    """Empirical P(draft k accepted | reached k) within 4σ of Σ min(p_t, p_d) (DESIGN §3)."""
    p_t, p_d, lengths, _, out = config_run(V, K)
    theory = acceptance_probability(p_t[:K], p_d).double()  # [K]
    torch.testing.assert_close(theory, torch.minimum(p_t[:K], p_d).sum(-1).double(), atol=1e-6, rtol=0)
    for k in range(K):
        at_risk = (out.num_accepted >= k) & (lengths > k)
        n = int(at_risk.sum())
        rate = (out.num_accepted[at_risk] > k).double().mean()
        sigma = (theory[k] * (1 - theory[k]) / n).sqrt()
        assert abs(rate - theory[k]) < 4 * sigma, (k, float(rate), float(theory[k]))


def _accept_always(p_t_x, p_d_x, u):
    return torch.ones_like(u, dtype=torch.bool)


def _resample_from_target(p_t, p_d):
    return p_t


def _verify_bonus_from_last_row(draft_tokens, lengths, draft_probs, target_probs, **kwargs):
    """Bug: the bonus token always drawn from row K instead of row lengths[r]."""
    R, K = draft_tokens.shape
    target_probs = target_probs.clone()  # [R, K+1, V]
    target_probs[torch.arange(R), lengths] = target_probs[:, K]
    return verify(draft_tokens, lengths, draft_probs, target_probs, **kwargs)


@pytest.mark.parametrize(
    "bug", ["accept_always", "resample_from_target", "residual_wrong_row", "bonus_from_last_row"]
)
def test_negative_controls_are_rejected(chi2_pvalue, monkeypatch, bug):
    """The same check must catch a broken sampler, or it proves nothing."""
    V, K = 8, 3
    p_t, p_d = toy_rows(V, K, seed=7)
    verify_fn = _verify_bonus_from_last_row if bug == "bonus_from_last_row" else verify
    if bug == "accept_always":
        monkeypatch.setattr(rejection, "accept_test", _accept_always)
    elif bug == "resample_from_target":
        monkeypatch.setattr(rejection, "residual_distribution", _resample_from_target)
    elif bug == "residual_wrong_row":  # off by one: the residual of position 1 at every rejection
        correct = rejection.residual_distribution
        monkeypatch.setattr(
            rejection,
            "residual_distribution",
            lambda pt, pd: correct(p_t[1].expand_as(pt), p_d[1].expand_as(pd)),
        )
    drafts, out = run_rounds(p_t, p_d, toy_lengths(N_ROUNDS, K, seed=0), seed=99, verify_fn=verify_fn)
    pvalues = position_pvalues(chi2_pvalue, p_t, drafts, out)
    assert min(pvalues) * len(pvalues) < 1e-6, pvalues


@pytest.mark.parametrize("bug", [None, "residual_keeps_the_draft"])
def test_deterministic_drafts_without_probs_follow_the_target(chi2_pvalue, monkeypatch, bug):
    """An n-gram-like proposer: each request's drafts are fixed before verification (here picked
    from ``p_d``, one proposal per request) and reported without probabilities (one-hot)."""
    V, K = 8, 3
    p_t, p_d = toy_rows(V, K, seed=13)
    if bug:  # the residual of a one-hot draft taken as p_t itself: x is emitted too often
        monkeypatch.setattr(rejection, "one_hot_residual", lambda pt, x: pt)
    lengths = toy_lengths(N_ROUNDS, K, seed=3)
    g = torch.Generator().manual_seed(4)
    drafts = torch.stack(
        [torch.multinomial(p_d[k], N_ROUNDS, replacement=True, generator=g) for k in range(K)], 1
    )
    out = verify(drafts, lengths, None, p_t.expand(N_ROUNDS, K + 1, V), generators=g)
    pvalues = position_pvalues(chi2_pvalue, p_t, drafts, out)
    if bug:
        assert min(pvalues) * len(pvalues) < 1e-6, pvalues
    else:
        assert min(pvalues) * len(pvalues) > ALPHA, pvalues


def test_empty_draft_emits_from_first_target_row(chi2_pvalue):
    V, R = 16, N_ROUNDS
    p_t, _ = toy_rows(V, 3, seed=3)  # [4, V]
    g = torch.Generator().manual_seed(0)
    # K == 0: no draft distributions at all.
    no_drafts, zero = torch.zeros(R, 0, dtype=torch.long), torch.zeros(R, dtype=torch.long)
    out = verify(no_drafts, zero, None, p_t[:1].expand(R, 1, V), generators=g)
    assert (out.num_accepted == 0).all()
    assert chi2_pvalue(out.next_tokens, p_t[0]) > ALPHA
    # K == 3 but nothing to verify: padding (out of vocab here) is ignored, row 0 is used.
    drafts = torch.full((R, 3), V + 5)
    p_d = torch.full((3, V), 1.0 / V)
    out = verify(drafts, zero, p_d.expand(R, 3, V), p_t.expand(R, 4, V), generators=g)
    assert (out.num_accepted == 0).all()
    assert chi2_pvalue(out.next_tokens, p_t[0]) > ALPHA


def test_disjoint_supports_always_reject_and_recover_from_target(chi2_pvalue):
    V, K = 8, 3
    g = torch.Generator().manual_seed(5)
    p_t = torch.softmax(torch.randn(K + 1, V, generator=g), dim=-1)
    p_t[:, : V // 2] = 0  # target lives on the upper half of the vocabulary ...
    p_t /= p_t.sum(-1, keepdim=True)
    p_d = torch.softmax(torch.randn(K, V, generator=g), dim=-1)
    p_d[:, V // 2 :] = 0  # ... the drafter on the lower half
    p_d /= p_d.sum(-1, keepdim=True)
    drafts, out = run_rounds(p_t, p_d, torch.full((N_ROUNDS,), K), seed=1)
    assert (out.num_accepted == 0).all()
    assert chi2_pvalue(out.next_tokens, p_t[0]) > ALPHA  # residual == p_t here


def test_identical_distributions_accept_all_and_bonus_follows_row_at_length(chi2_pvalue):
    V, K = 8, 3
    p_t, _ = toy_rows(V, K, seed=11)
    lengths = torch.arange(N_ROUNDS) % (K + 1)  # every length 0..K
    drafts, out = run_rounds(p_t, p_t[:K], lengths, seed=2)
    assert torch.equal(out.num_accepted, lengths)
    pvalues = [chi2_pvalue(out.next_tokens[lengths == n], p_t[n]) for n in range(K + 1)]
    assert min(pvalues) * len(pvalues) > ALPHA, pvalues


def test_markov_target_over_several_rounds_is_reproduced(chi2_pvalue):
    """End to end on a context-dependent toy: the generated sequence follows the target.

    Target and drafter are Markov chains (next-token table indexed by the previous
    token); every round drafts K tokens from the drafter, verifies a random number of
    them, and continues from the last emitted token, as the engine does. The first three
    generated tokens must follow ``P(a, b, c) = T[s, a] T[a, b] T[b, c]``.
    """
    V, K, R, N, start = 8, 3, N_ROUNDS, 3, 0
    g = torch.Generator().manual_seed(21)
    logits = 1.5 * torch.randn(V, V, generator=g)
    table_t = torch.softmax(logits, dim=-1)  # [V, V]: row = previous token
    table_d = torch.softmax(logits + 0.8 * torch.randn(V, V, generator=g), dim=-1)  # [V, V]
    rows = torch.arange(R)
    generated = torch.zeros(R, N * (K + 1), dtype=torch.long)  # every round emits <= K+1
    num_generated = torch.zeros(R, dtype=torch.long)
    anchor = torch.full((R,), start)
    for _ in range(N):  # each round emits >= 1 token
        context = torch.zeros(R, K + 1, dtype=torch.long)  # [R, K+1] token before each position
        context[:, 0] = anchor
        for k in range(K):
            context[:, k + 1] = torch.multinomial(table_d[context[:, k]], 1, generator=g).squeeze(1)
        drafts = context[:, 1:]  # [R, K]
        lengths = torch.randint(0, K + 1, (R,), generator=g)
        out = verify(drafts, lengths, table_d[context[:, :K]], table_t[context], generators=g)
        emitted = torch.cat([drafts, torch.zeros(R, 1, dtype=torch.long)], dim=1)  # [R, K+1]
        emitted[rows, out.num_accepted] = out.next_tokens
        slots = torch.arange(K + 1)
        keep = slots < (out.num_accepted + 1).unsqueeze(1)  # [R, K+1]
        dest = num_generated.unsqueeze(1) + slots  # [R, K+1]
        generated[rows.unsqueeze(1).expand_as(dest)[keep], dest[keep]] = emitted[keep]
        num_generated += out.num_accepted + 1
        anchor = out.next_tokens
    a, b, c = generated[:, 0], generated[:, 1], generated[:, 2]
    joint = table_t[start][:, None, None] * table_t[:, :, None] * table_t[None, :, :]  # [V, V, V]
    assert chi2_pvalue(a * V * V + b * V + c, joint.flatten()) > ALPHA
