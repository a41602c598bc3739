"""Logits → probabilities: temperature, top-k, top-p (DESIGN §3)."""

from __future__ import annotations

import math

import pytest
import torch

from dspark.protocols import SamplingParams
from dspark.sampling.probs import batch_probs, process_logits

# Sorted probabilities 0.5 / 0.3 / 0.15 / 0.05, shuffled over the vocabulary.
PROBS = torch.tensor([0.15, 0.5, 0.05, 0.3])
LOGITS = PROBS.log()


def kept(probs: torch.Tensor) -> set[int]:
    return set(probs.nonzero().flatten().tolist())


def test_temperature_scales_logits_in_fp32():
    logits = torch.randn(3, 5, 11).to(torch.bfloat16)
    probs = process_logits(logits, SamplingParams(temperature=0.7))
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, torch.softmax(logits.float() / 0.7, dim=-1))


def test_temperature_zero_is_one_hot_at_argmax_whatever_top_k_top_p():
    logits = torch.tensor([[0.1, 3.0, 3.0, -1.0]])  # tie: the lowest id wins
    probs = process_logits(logits, SamplingParams(temperature=0.0, top_k=2, top_p=0.3))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_top_k_keeps_the_k_most_likely_renormalised():
    probs = process_logits(LOGITS, SamplingParams(top_k=2))
    torch.testing.assert_close(probs, torch.tensor([0.0, 0.625, 0.0, 0.375]))


@pytest.mark.parametrize(
    "top_p,expected",
    [(0.01, {1}), (0.45, {1}), (0.75, {1, 3}), (0.85, {1, 3, 0}), (0.96, {0, 1, 2, 3}), (1.0, {0, 1, 2, 3})],
)
def test_top_p_keeps_the_smallest_set_with_enough_mass(top_p, expected):
    probs = process_logits(LOGITS, SamplingParams(top_p=top_p))
    assert kept(probs) == expected
    torch.testing.assert_close(probs, torch.where(probs > 0, PROBS, 0) / PROBS[list(expected)].sum())


def test_top_p_applies_to_the_top_k_renormalised_distribution():
    # top-3 renormalised: 0.526 / 0.316 / 0.158; mass before the third is 0.842.
    assert kept(process_logits(LOGITS, SamplingParams(top_k=3, top_p=0.8))) == {1, 3}
    assert kept(process_logits(LOGITS, SamplingParams(top_k=3, top_p=0.9))) == {1, 3, 0}


def test_top_p_off_keeps_a_long_tail_of_tiny_tokens():
    logits = torch.cat([torch.tensor([30.0]), torch.zeros(999)])  # tail mass ~1e-10 in total
    assert kept(process_logits(logits, SamplingParams(top_p=1.0))) == set(range(1000))


def test_masked_logits_stay_at_zero_probability():
    logits = torch.tensor([1.0, -math.inf, 0.5, -math.inf])
    for params in [SamplingParams(), SamplingParams(top_k=3), SamplingParams(top_p=0.99)]:
        probs = process_logits(logits, params)
        assert probs[1] == 0 and probs[3] == 0
        torch.testing.assert_close(probs.sum(), torch.tensor(1.0))


def test_batch_probs_applies_each_requests_params():
    logits = torch.randn(4, 3, 50, generator=torch.Generator().manual_seed(0))
    params = [
        SamplingParams(),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.5, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.6, seed=1),
    ]
    probs = batch_probs(logits, params)
    for r, p in enumerate(params):
        torch.testing.assert_close(probs[r], process_logits(logits[r], p))


def test_batch_probs_with_shared_params_matches_process_logits():
    logits = torch.randn(5, 2, 20, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0.8, top_k=7, top_p=0.9, seed=r) for r in range(5)]
    torch.testing.assert_close(batch_probs(logits, params), process_logits(logits, params[0]))


def test_tiny_top_p_keeps_the_argmax_instead_of_nan():
    from dspark.protocols import SamplingParams
    from dspark.sampling.probs import process_logits

    logits = torch.tensor([0.5, 2.0, -1.0, 1.9])
    probs = process_logits(logits, SamplingParams(temperature=1.0, top_p=1e-300))
    assert torch.equal(probs, torch.tensor([0.0, 1.0, 0.0, 0.0]))
