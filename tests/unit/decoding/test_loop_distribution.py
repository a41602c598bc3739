"""Sampled speculative decoding keeps the target's joint distribution (DESIGN §3).

The target is an order-1 Markov chain behind the adapter's interface (a stub with
hand-set logits, in the litgpt style), so the exact distribution of every 3-token
continuation is known in closed form and 10k runs take seconds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from dspark.decoding import speculative_generate
from dspark.protocols import SamplingParams
from dspark.targets import TargetOutput

from .drafters_for_tests import RandomDrafter

V = 5


@dataclass
class _Cache:
    length: int = 0


class MarkovTarget:
    """p(x_t | x_<t) = P[x_{t-1}]: the adapter surface the loop uses, nothing more."""

    eos_token_ids: tuple[int, ...] = ()
    max_context = 64
    device = torch.device("cpu")

    def __init__(self, transition: torch.Tensor) -> None:
        self.log_p = transition.log()  # [V, V]
        self.vocab_size = transition.shape[0]

    def new_cache(self) -> _Cache:
        return _Cache()

    def forward(self, ids: torch.Tensor, cache: _Cache, *, with_features: bool = True) -> TargetOutput:
        cache.length += ids.shape[1]
        logits = self.log_p[ids]  # [B, T, V]
        return TargetOutput(logits=logits, features=None, hidden=torch.zeros(*ids.shape, 1))

    def rollback(self, cache: _Cache, length: int) -> None:
        assert length <= cache.length
        cache.length = length


def _transition(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(V, V, generator=g) * 1.5, dim=-1)


def _exact_joint(P: torch.Tensor, last: int) -> np.ndarray:
    probs = np.zeros(V**3)
    for i, (a, b, c) in enumerate(itertools.product(range(V), repeat=3)):
        probs[i] = float(P[last, a]) * float(P[a, b]) * float(P[b, c])
    return probs / probs.sum()


@pytest.mark.parametrize("block_size", [1, 3])
def test_joint_three_token_distribution_matches_target(block_size):
    P = _transition(0)
    target = MarkovTarget(P)
    drafter = RandomDrafter(V, seed=1, sharpness=1.5)  # mismatched on purpose
    prompt = [0, 3]
    counts = np.zeros(V**3)
    runs = 6000
    for seed in range(runs):
        params = SamplingParams(temperature=1.0, max_tokens=3, seed=seed)
        out = speculative_generate(target, drafter, prompt, params, block_size=block_size).token_ids
        assert len(out) == 3
        counts[out[0] * V * V + out[1] * V + out[2]] += 1
    expected = _exact_joint(P, prompt[-1]) * runs
    keep = expected >= 5  # chi-square validity; the tiny rest is pooled
    f_obs = np.append(counts[keep], counts[~keep].sum())
    f_exp = np.append(expected[keep], expected[~keep].sum())
    assert chisquare(f_obs, f_exp).pvalue > 1e-3


def test_negative_control_draft_distribution_leaks():
    """Accepting drafts without the ratio test must be caught by the same statistic."""
    P = _transition(0)
    Q = _transition(7)
    runs, prompt = 4000, [0, 3]
    g = torch.Generator().manual_seed(0)
    counts = np.zeros(V**3)
    for _ in range(runs):  # "always accept" = sample the whole continuation from the drafter
        prev, seq = prompt[-1], []
        for _ in range(3):
            prev = int(torch.multinomial(Q[prev], 1, generator=g))
            seq.append(prev)
        counts[seq[0] * V * V + seq[1] * V + seq[2]] += 1
    expected = _exact_joint(P, prompt[-1]) * runs
    keep = expected >= 5
    f_obs = np.append(counts[keep], counts[~keep].sum())
    f_exp = np.append(expected[keep], expected[~keep].sum())
    assert chisquare(f_obs, f_exp).pvalue < 1e-6
