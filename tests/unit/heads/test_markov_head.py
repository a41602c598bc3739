"""Markov head, paper Eq. 5: ``B(x_{k-1}, ·) = W_1[x_{k-1}] W_2`` on hand-set tiny matrices."""

from __future__ import annotations

import torch

from dspark.heads import MarkovHead

W1 = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, -1.0]])  # [V=3, r=2]
W2 = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]])  # [r=2, V=3]


def head() -> MarkovHead:
    m = MarkovHead(vocab_size=3, rank=2)
    with torch.no_grad():
        m.markov_w1.weight.copy_(W1)
        m.markov_w2.weight.copy_(W2.T)  # stored as W_2ᵀ [V, r] (DeepSpec layout)
    return m


def test_bias_is_w1_row_times_w2():
    with torch.no_grad():
        bias, emb, state = head().step(torch.tensor([2, 1]), torch.zeros(2, 4), None)
    # x = 2: [1, -1] @ W2 = [0.5, 2, 4];  x = 1: [0, 2] @ W2 = [1, 0, -2]
    torch.testing.assert_close(bias, torch.tensor([[0.5, 2.0, 4.0], [1.0, 0.0, -2.0]]))
    torch.testing.assert_close(emb, W1[[2, 1]])
    assert state is None


def test_teacher_forced_equals_steps():
    m = head()
    prev = torch.tensor([[[0, 2, 1]]])  # [B=1, A=1, K=3]
    with torch.no_grad():
        bias, emb = m.teacher_forced(prev, torch.zeros(1, 1, 3, 4))
        steps = [m.step(prev[0, 0, k : k + 1], torch.zeros(1, 4), None)[0] for k in range(3)]
    torch.testing.assert_close(bias[0, 0], torch.cat(steps))
    torch.testing.assert_close(emb[0, 0], W1[[0, 2, 1]])


def test_fresh_head_adds_nothing():
    """W_2 starts at 0: an untrained DSpark drafts like its backbone."""
    m = MarkovHead(vocab_size=5, rank=3)
    m.reset_parameters(0.1)
    assert torch.equal(m.step(torch.tensor([4]), torch.zeros(1, 2), None)[0], torch.zeros(1, 5))
