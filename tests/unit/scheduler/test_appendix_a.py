"""Paper Appendix A: a global search without early stopping is not lossless; ``prefix`` is.

One request, γ = 2, vocabulary {A, B}; SPS(1) = 1.0, SPS(2) = 0.5, SPS(3) = 0.45; the first
draft is sampled from p_d = (0.5, 0.5), the target is p_t = (0.7, 0.3), c_1 = 0.8 and the
Markov-style confidence c_2 is 0.9 after A, 0 after B. A global search verifies x_1 only
when it is A, and the first output token becomes (0.85, 0.15).
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from dspark.sampling import verify
from dspark.scheduler import SpsTable, global_search, parse_policy, prefix_lengths, schedule

A, B = 0, 1
SPS = SpsTable.from_dict({1: 1.0, 2: 0.5, 3: 0.45})
P_T = torch.tensor([0.7, 0.3])
P_D = torch.tensor([0.5, 0.5])
N = 20_000


def confidences(x1: int) -> torch.Tensor:
    return torch.tensor([[0.8, 0.9 if x1 == A else 0.0]])


def test_the_papers_numbers():
    caps = torch.tensor([2])
    assert global_search(confidences(A), caps, SPS).tolist() == [2]  # Θ2 = 2.52 · 0.45 = 1.134
    assert global_search(confidences(B), caps, SPS).tolist() == [0]  # Θ0 = 1.0 is the maximum
    # Algorithm 1 stops at Θ1 = 0.9 < Θ0 whatever x_1 is: the decision cannot see x_1.
    assert prefix_lengths(confidences(A), caps, SPS).tolist() == [0]
    assert prefix_lengths(confidences(B), caps, SPS).tolist() == [0]


def first_output_tokens(lengths_for) -> torch.Tensor:
    """Simulate N rounds; ``lengths_for(x1)`` is the scheduler's verification length."""
    g = torch.Generator().manual_seed(0)
    x1 = torch.multinomial(P_D, N, replacement=True, generator=g)  # [N]
    x2 = torch.multinomial(P_D, N, replacement=True, generator=g)
    lengths = torch.tensor([lengths_for(int(x)) for x in (A, B)])[x1]  # [N]
    draft_probs = P_D.expand(N, 2, 2).clone()  # [N, K, V]
    target_probs = P_T.expand(N, 3, 2).clone()  # [N, K+1, V]; later positions irrelevant here
    out = verify(torch.stack([x1, x2], dim=-1), lengths, draft_probs, target_probs, generators=g)
    first = torch.where(out.num_accepted > 0, x1, out.next_tokens)  # the round's first emitted token
    return torch.bincount(first, minlength=2).double()


def pvalue(counts: torch.Tensor, p: torch.Tensor) -> float:
    p = p.double() / p.double().sum()
    return float(chisquare(counts.numpy(), (p * counts.sum()).numpy()).pvalue)


def test_global_search_biases_the_output():
    counts = first_output_tokens(lambda x1: int(global_search(confidences(x1), torch.tensor([2]), SPS)[0]))
    assert pvalue(counts, torch.tensor([0.85, 0.15])) > 1e-3
    assert pvalue(counts, P_T) < 1e-12


@pytest.mark.parametrize("policy", ["prefix", "prefix-async"])
def test_prefix_policies_keep_the_target(policy):
    # prefix-async's budget comes from confidences two steps old: independent of this x_1.
    stale = torch.tensor([[0.8, 0.9]])

    def lengths_for(x1: int) -> int:
        return int(
            schedule(
                parse_policy(policy),
                torch.tensor([2]),
                confidences(x1),
                sps=SPS,
                stale_confidences=stale,
                stale_caps=torch.tensor([2]),
            )[0]
        )

    counts = first_output_tokens(lengths_for)
    assert pvalue(counts, P_T) > 1e-3
    if policy == "prefix-async":  # the stale budget (2 tokens) admits x_1 both ways
        assert lengths_for(A) == 2 and lengths_for(B) == 1
