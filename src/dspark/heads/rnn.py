"""The RNN head: a gated recurrent transition bias over the whole block prefix (paper Eq. 6, DESIGN §5.3).

At step k the head reads ``z_k = [s_{k-1}; W_1[x_{k-1}]; h_k]`` (``2r + H``), applies one
linear map ``(2r + H → 3r)`` split into gate g, candidate c and output o, and returns

    s_k = σ(g) ⊙ s_{k-1} + (1 - σ(g)) ⊙ tanh(c),    B_k = W_2ᵀ tanh(o),    s_0 = 0.

Same ``markov_w1``/``markov_w2`` keys as the Markov head, plus the projection
``joint_proj.weight [3r, 2r+H]`` and ``joint_proj.bias [3r]``: the names and the
``[s; emb; h]`` / ``(g, c, o)`` order that DeepSpec, SGLang and speculators use (DESIGN §14).
Checkpoints of dspark < 0.2 named it ``rnn_proj.weight`` with no bias; they still load
(:func:`upgrade_rnn_keys`), with a zero bias, which is the function they were trained as.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RNNHead(nn.Module):
    """Transition bias from a recurrent state that accumulates the block prefix."""

    def __init__(
        self, vocab_size: int, rank: int, hidden_size: int, draft_vocab_size: int | None = None
    ) -> None:
        super().__init__()
        self.rank = rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)  # previous token: any target id
        self.markov_w2 = nn.Linear(rank, draft_vocab_size or vocab_size, bias=False)  # draft-vocabulary bias
        self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def reset_parameters(self, std: float) -> None:
        """W_1, the projection ~ N(0, std), its bias 0; W_2 = 0 (start as the backbone alone)."""
        nn.init.normal_(self.markov_w1.weight, std=std)
        nn.init.normal_(self.joint_proj.weight, std=std)
        nn.init.zeros_(self.joint_proj.bias)
        nn.init.zeros_(self.markov_w2.weight)

    def embed(self, prev: Tensor) -> Tensor:
        """``W_1[x_{k-1}]``: ``[...]`` long → ``[..., r]``."""
        return self.markov_w1(prev)

    def initial_state(self, R: int, like: Tensor) -> Tensor:
        """``s_0 = 0``: ``[R, r]``."""
        return like.new_zeros(R, self.rank)

    def _transition(self, prev: Tensor, h: Tensor, state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """prev ``[N]``, h ``[N, H]``, s_{k-1} ``[N, r]`` → bias factor ``tanh(o) [N, r]``, emb, s_k."""
        emb = self.embed(prev)  # [N, r]
        z = torch.cat([state, emb, h.to(emb.dtype)], dim=-1)  # [N, 2r+H]
        g, c, o = self.joint_proj(z).chunk(3, dim=-1)  # 3 x [N, r]
        gate = torch.sigmoid(g)
        new_state = gate * state + (1.0 - gate) * torch.tanh(c)
        return torch.tanh(o), emb, new_state

    def step(self, prev: Tensor, h: Tensor, state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """prev ``[N]``, h ``[N, H]``, s_{k-1} ``[N, r]`` → bias ``[N, V]``, emb, s_k ``[N, r]``."""
        u, emb, new_state = self._transition(prev, h, state)
        return self.markov_w2(u), emb, new_state

    def teacher_forced_factors(self, prev: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """Run the recurrence over K slots with ground-truth previous tokens.

        prev ``[B, A, K]``, h ``[B, A, K, H]`` → the bias factors ``tanh(o_k) [B, A, K, r]``
        (bias = ``markov_w2(u)``) and the embeddings ``[B, A, K, r]``.
        """
        B, A, K = prev.shape
        flat_prev = prev.reshape(B * A, K)  # [N, K]
        flat_h = h.reshape(B * A, K, -1)  # [N, K, H]
        state = self.initial_state(B * A, self.markov_w1.weight)
        factors, embs = [], []
        for k in range(K):
            u, emb, state = self._transition(flat_prev[:, k], flat_h[:, k], state)
            factors.append(u)
            embs.append(emb)
        u = torch.stack(factors, dim=1).view(B, A, K, self.rank)
        return u, torch.stack(embs, dim=1).view(B, A, K, self.rank)

    def teacher_forced(self, prev: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """prev ``[B, A, K]``, h ``[B, A, K, H]`` → bias ``[B, A, K, V]``, emb ``[B, A, K, r]``."""
        u, emb = self.teacher_forced_factors(prev, h)
        return self.markov_w2(u), emb


LEGACY_PROJ, PROJ = "markov_head.rnn_proj.weight", "markov_head.joint_proj"


def upgrade_rnn_keys(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename a legacy ``rnn_proj.weight`` (no bias) to ``joint_proj.{weight,bias}``, bias 0.

    The old head computed ``W z``; ``W z + 0`` is the same function, so a legacy drafter
    keeps its drafts exactly. A state without the legacy key is returned unchanged.
    """
    if LEGACY_PROJ not in state:
        return state
    if f"{PROJ}.weight" in state:
        raise ValueError(f"weights hold both {LEGACY_PROJ} and {PROJ}.weight; keep one of the two")
    out = {k: v for k, v in state.items() if k != LEGACY_PROJ}
    weight = state[LEGACY_PROJ]  # [3r, 2r+H]
    out[f"{PROJ}.weight"] = weight
    out[f"{PROJ}.bias"] = weight.new_zeros(weight.shape[0])  # [3r]
    return out
