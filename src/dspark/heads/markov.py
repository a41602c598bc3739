"""The Markov head: a low-rank first-order transition bias on the draft logits (paper Eq. 5, DESIGN §5.3).

``B(x_{k-1}, ·) = W_1[x_{k-1}] W_2`` with ``W_1: V×r`` an embedding lookup and
``W_2: r×V`` a logit projection (``r×N`` over a reduced draft vocabulary),
added to the backbone's base logits ``U_k`` with no gate. ``W_1[x]`` is also the
*Markov embedding* the confidence head reads (Eq. 7).

Stored as ``markov_w1.weight [V, r]`` (= W_1) and ``markov_w2.weight [V, r]`` (= W_2ᵀ),
the DeepSpec key layout (DESIGN §5.4).
"""

from __future__ import annotations

from torch import Tensor, nn


class MarkovHead(nn.Module):
    """Transition bias from the previous token only; stateless."""

    def __init__(self, vocab_size: int, rank: int, draft_vocab_size: int | None = None) -> None:
        super().__init__()
        self.rank = rank
        # W_1 reads the previous token (any target id); W_2 writes draft-vocabulary logits.
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size or vocab_size, bias=False)

    def reset_parameters(self, std: float) -> None:
        """W_1 ~ N(0, std); W_2 = 0, so an untrained DSpark starts as its DFlash backbone."""
        nn.init.normal_(self.markov_w1.weight, std=std)
        nn.init.zeros_(self.markov_w2.weight)

    def embed(self, prev: Tensor) -> Tensor:
        """Markov embedding ``W_1[x_{k-1}]``: ``[...]`` long → ``[..., r]``."""
        return self.markov_w1(prev)

    def initial_state(self, R: int, like: Tensor) -> None:
        return None

    def step(self, prev: Tensor, h: Tensor, state: None) -> tuple[Tensor, Tensor, None]:
        """One drafting step: prev ``[R]``, h ``[R, H]`` (unused) → bias ``[R, V]``, emb ``[R, r]``."""
        emb = self.embed(prev)  # [R, r]
        return self.markov_w2(emb), emb, None

    def teacher_forced_factors(self, prev: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """All slots at once, ground-truth previous tokens ``[...]``: the bias factor u and the embedding.

        The bias is ``markov_w2(u)`` (``u = W_1[x_{k-1}]``, so both are ``[..., r]`` and equal).
        """
        emb = self.embed(prev)  # [..., r]
        return emb, emb

    def teacher_forced(self, prev: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """All slots at once given ground-truth previous tokens ``[B, A, K]`` → bias ``[B, A, K, V]``, emb."""
        u, emb = self.teacher_forced_factors(prev, h)
        return self.markov_w2(u), emb
