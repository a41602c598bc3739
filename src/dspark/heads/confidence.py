"""The confidence head: predicted conditional acceptance of each draft (paper Eq. 7, DESIGN §5.3).

``c_k = σ(wᵀ [h_k ; W_1[x_{k-1}]] + b)``: a linear map plus sigmoid on the backbone's
hidden state and the Markov embedding of the previous token (``with_markov``; without a
sequential head it reads ``h_k`` alone). Keys: ``proj.weight [1, H + r]``, ``proj.bias [1]``.

Sequential Temperature Scaling (DESIGN §8) divides the logit of position k by ``T_k``;
the temperatures are fitted after training and live in the drafter's config.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ConfidenceHead(nn.Module):
    """Linear + sigmoid over ``[h_k ; W_1[x_{k-1}]]``."""

    def __init__(self, hidden_size: int, markov_rank: int = 0) -> None:
        super().__init__()
        self.markov_rank = markov_rank
        self.proj = nn.Linear(hidden_size + markov_rank, 1)

    def logits(self, h: Tensor, markov_emb: Tensor | None) -> Tensor:
        """Confidence logits ``[...]`` from h ``[..., H]`` and the Markov embedding ``[..., r]``."""
        if self.markov_rank:
            assert markov_emb is not None, "this confidence head reads the Markov embedding"
            h = torch.cat([h, markov_emb.to(h.dtype)], dim=-1)  # [..., H + r]
        return self.proj(h).squeeze(-1)

    def forward(self, h: Tensor, markov_emb: Tensor | None) -> Tensor:
        """``c_k`` in (0, 1): ``[...]``."""
        return torch.sigmoid(self.logits(h, markov_emb))


def scale_confidence_logits(logits: Tensor, temperatures: tuple[float, ...] | None) -> Tensor:
    """STS: ``logit_k / T_k`` for logits ``[..., K]`` (positions past the fitted ones keep the last T)."""
    if temperatures is None:
        return logits
    K = logits.shape[-1]
    t = list(temperatures[:K]) + [temperatures[-1]] * max(0, K - len(temperatures))
    return logits / torch.tensor(t, dtype=logits.dtype, device=logits.device)
