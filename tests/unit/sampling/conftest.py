"""Shared statistics for the sampling tests."""

from __future__ import annotations

import pytest
import torch
from scipy import stats


def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness-of-fit p-value of integer ``samples [N]`` against ``probs [V]``.

    Tokens with probability 0 must never appear (checked exactly); bins whose expected
    count is below 5 are pooled so the chi-square approximation holds.
    """
    V = probs.shape[-1]
    counts = torch.bincount(samples, minlength=V).double()  # [V]
    probs = probs.double()
    impossible = probs == 0
    bad = (impossible & (counts > 0)).nonzero().flatten().tolist()
    assert not bad, f"sampled tokens of probability 0: {bad}"
    expected = probs * samples.numel() / probs.sum()
    small = (expected < 5) & ~impossible
    big = (expected >= 5) & ~impossible
    obs = torch.cat([counts[big], counts[small].sum().view(1)])
    exp = torch.cat([expected[big], expected[small].sum().view(1)])
    if exp[-1] == 0:  # nothing pooled
        obs, exp = obs[:-1], exp[:-1]
    if obs.numel() < 2:  # a single possible outcome: the check above was the whole test
        return 1.0
    return float(stats.chisquare(obs.numpy(), exp.numpy()).pvalue)


@pytest.fixture(name="chi2_pvalue")
def chi2_pvalue_fixture():
    return chi2_pvalue
