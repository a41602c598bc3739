"""Confidence head, paper Eq. 7: ``c_k = σ(wᵀ[h_k; W_1[x_{k-1}]] + b)``, and STS scaling (DESIGN §8)."""

from __future__ import annotations

import math

import torch

from dspark.heads import ConfidenceHead, scale_confidence_logits


def test_confidence_reads_hidden_and_markov_embedding():
    m = ConfidenceHead(hidden_size=2, markov_rank=1)
    with torch.no_grad():
        m.proj.weight.copy_(torch.tensor([[1.0, -2.0, 0.5]]))
        m.proj.bias.fill_(0.25)
    h, emb = torch.tensor([[0.5, 1.0]]), torch.tensor([[2.0]])
    logit = 1.0 * 0.5 - 2.0 * 1.0 + 0.5 * 2.0 + 0.25  # = -0.25
    torch.testing.assert_close(m(h, emb), torch.tensor([1 / (1 + math.exp(-logit))]))


def test_confidence_without_markov_reads_hidden_only():
    m = ConfidenceHead(hidden_size=2)
    assert m.proj.weight.shape == (1, 2)
    with torch.no_grad():
        m.proj.weight.copy_(torch.tensor([[1.0, 1.0]]))
        m.proj.bias.zero_()
    torch.testing.assert_close(m.logits(torch.tensor([[0.5, 1.0]]), None), torch.tensor([1.5]))


def test_sts_divides_logit_k_by_t_k():
    logits = torch.tensor([[2.0, -1.0, 4.0]])
    assert torch.equal(scale_confidence_logits(logits, None), logits)
    torch.testing.assert_close(
        scale_confidence_logits(logits, (2.0, 0.5, 4.0)), torch.tensor([[1.0, -2.0, 1.0]])
    )
    # Fewer temperatures than positions: the last one carries on.
    torch.testing.assert_close(scale_confidence_logits(logits, (2.0,)), torch.tensor([[1.0, -0.5, 2.0]]))
