"""RNN head, paper Eq. 6, on hand-set tiny matrices.

``z_k = [s_{k-1}; W_1[x_{k-1}]; h_k]``; ``g, c, o = split(W z_k)``;
``s_k = σ(g)⊙s_{k-1} + (1-σ(g))⊙tanh(c)``; ``B_k = W_2ᵀ tanh(o)``; ``s_0 = 0``.
"""

from __future__ import annotations

import torch

from dspark.heads import RNNHead

V, R, H = 3, 1, 1
W1 = torch.tensor([[1.0], [-1.0], [0.5]])  # [V, r]
W2 = torch.tensor([[1.0, -2.0, 0.5]])  # [r, V]
# Rows: g, c, o; columns: s, W1[x], h.
W = torch.tensor([[0.5, 1.0, 0.0], [1.0, 0.0, 2.0], [-1.5, 1.0, 1.0]])


def head() -> RNNHead:
    m = RNNHead(vocab_size=V, rank=R, hidden_size=H)
    with torch.no_grad():
        m.markov_w1.weight.copy_(W1)
        m.markov_w2.weight.copy_(W2.T)
        m.joint_proj.weight.copy_(W)
        m.joint_proj.bias.zero_()
    return m


def by_hand(prev: list[int], h: list[float]) -> list[torch.Tensor]:
    s, out = 0.0, []
    for x, hk in zip(prev, h):
        e = float(W1[x, 0])
        g = 0.5 * s + 1.0 * e
        c = 1.0 * s + 2.0 * hk
        o = -1.5 * s + 1.0 * e + 1.0 * hk  # reads s_{k-1}, not s_k
        sig = 1 / (1 + torch.exp(torch.tensor(-g)))
        s = float(sig * s + (1 - sig) * torch.tanh(torch.tensor(c)))
        out.append(torch.tanh(torch.tensor(o)) * W2[0])
    return out


def test_steps_follow_eq6():
    m, prev, h = head(), [0, 2, 1], [0.3, -0.7, 1.1]
    state = m.initial_state(1, torch.zeros(1))
    assert torch.equal(state, torch.zeros(1, R))
    with torch.no_grad():
        for k, expected in enumerate(by_hand(prev, h)):
            bias, emb, state = m.step(torch.tensor([prev[k]]), torch.tensor([[h[k]]]), state)
            torch.testing.assert_close(bias[0], expected)
            torch.testing.assert_close(emb[0], W1[prev[k]])


def test_state_carries_the_prefix():
    """Unlike the Markov head, step 3's bias depends on x_0 through the state."""
    m = head()
    with torch.no_grad():
        h = torch.full((1, 1, 3, H), 0.5)
        a, _ = m.teacher_forced(torch.tensor([[[0, 2, 1]]]), h)
        b, _ = m.teacher_forced(torch.tensor([[[1, 2, 1]]]), h)
    assert not torch.allclose(a[0, 0, 2], b[0, 0, 2])


def test_teacher_forced_equals_steps():
    m, prev, h = head(), [2, 0, 1], [0.1, 0.2, -0.4]
    with torch.no_grad():
        bias, _ = m.teacher_forced(torch.tensor([[prev]]), torch.tensor(h).view(1, 1, 3, 1))
    torch.testing.assert_close(bias[0, 0], torch.stack(by_hand(prev, h)))


def test_the_bias_enters_gate_candidate_and_output():
    """``W z + b``: a bias on the output row alone moves the first bias exactly as by hand."""
    m = head()
    with torch.no_grad():
        m.joint_proj.bias.copy_(torch.tensor([0.0, 0.0, 0.7]))
        bias, _, _ = m.step(torch.tensor([0]), torch.tensor([[0.3]]), m.initial_state(1, torch.zeros(1)))
    o = 1.0 * float(W1[0, 0]) + 0.3 + 0.7  # s_0 = 0
    torch.testing.assert_close(bias[0], torch.tanh(torch.tensor(o)) * W2[0])


def test_legacy_rnn_proj_keys_upgrade_with_a_zero_bias():
    from dspark.heads.rnn import upgrade_rnn_keys

    legacy = {"markov_head.rnn_proj.weight": W.clone(), "fc.weight": torch.ones(1)}
    new = upgrade_rnn_keys(legacy)
    assert set(new) == {"markov_head.joint_proj.weight", "markov_head.joint_proj.bias", "fc.weight"}
    assert torch.equal(new["markov_head.joint_proj.weight"], W)
    assert torch.equal(new["markov_head.joint_proj.bias"], torch.zeros(3))
    assert upgrade_rnn_keys(new) == new
