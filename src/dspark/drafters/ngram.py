"""N-gram (prompt lookup) drafter: training-free baseline known from vLLM and HF.

Finds the most recent earlier occurrence of the longest suffix (``max_n`` down to
``min_n`` tokens) of the sequence, and proposes the tokens that followed it. The
proposal is deterministic, so its draft distribution is one-hot: verification accepts
draft ``x`` with probability ``p_t(x)`` and otherwise samples from ``norm(p_t - e_x)``,
which keeps the target distribution (DESIGN §3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dspark.protocols import DraftBlock, DrafterTraits, SamplingParams, SequenceState


@dataclass(frozen=True, kw_only=True)
class NgramConfig:
    min_n: int = 1
    max_n: int = 4
    block_size: int = 7  # the most tokens proposed in a round


def lookup(tokens: np.ndarray, max_len: int, min_n: int, max_n: int) -> list[int]:
    """Continuation of the most recent earlier match of the longest suffix of ``tokens``.

    ``tokens`` is ``[T]``; returns at most ``max_len`` ids (empty when nothing matches).
    Only earlier positions holding the last token can end a match, so the suffix is
    compared backwards from those alone (one pass over ``tokens``, then ``max_n`` steps
    over the candidates): the payoff controller looks up every decoding request.
    """
    T = tokens.shape[0]
    top = min(max_n, T - 1)
    if top < max(min_n, 1):
        return []
    ends = np.flatnonzero(tokens[: T - 1] == tokens[T - 1])  # [C] where an earlier match may end
    matched = np.ones(ends.size, dtype=np.int64)  # [C] length of the common suffix, up to top
    alive = np.ones(ends.size, dtype=bool)
    for k in range(1, top):
        prev = ends - k
        alive &= prev >= 0
        alive[alive] = tokens[prev[alive]] == tokens[T - 1 - k]
        matched += alive
    for n in range(top, min_n - 1, -1):
        hits = ends[matched >= n]
        if hits.size:
            start = int(hits[-1]) + 1  # the token after the most recent match
            return tokens[start : start + max_len].tolist()
    return []


class TokenPositions:
    """Where each token value occurs in one growing sequence, for :func:`lookup` without a scan.

    The engine looks up every decoding request before it plans a round (its offer and its shadow):
    a numpy pass over the whole context per request costs tens of microseconds, where the
    positions of the last token are all a lookup needs. The index grows lazily to the
    sequence's length at each lookup (the engine only appends committed tokens; a sequence
    that shrank is indexed afresh).
    """

    def __init__(self) -> None:
        self.where: dict[int, list[int]] = {}
        self.upto = 0  # positions 0 .. upto-1 are indexed

    def lookup(self, tokens: list[int], max_len: int, min_n: int, max_n: int) -> list[int]:
        """:func:`lookup` of ``tokens`` (the same result, tested)."""
        T = len(tokens)
        top = min(max_n, T - 1)
        if top < max(min_n, 1):
            return []
        if self.upto > T - 1:
            self.where, self.upto = {}, 0
        where = self.where
        for p in range(self.upto, T - 1):  # the last token cannot end an earlier match
            where.setdefault(tokens[p], []).append(p)
        self.upto = T - 1
        best_n, best_p = 0, -1
        for p in reversed(where.get(tokens[T - 1], ())):  # most recent first: it wins ties
            m = 1  # common suffix length, the last token included
            while m < top and m <= p and tokens[p - m] == tokens[T - 1 - m]:
                m += 1
            if m > best_n:
                best_n, best_p = m, p
                if m == top:
                    break
        if best_p < 0 or best_n < min_n:
            return []
        return tokens[best_p + 1 : best_p + 1 + max_len]


class NgramDrafter:
    """Prompt-lookup drafter behind the :class:`~dspark.protocols.Drafter` protocol: its
    proposal is a function of the tokens (``traits.deterministic``), looked up through each
    request's :class:`TokenPositions` (kept on ``state.lookup_index``)."""

    target_layer_ids: tuple[int, ...] = ()
    traits = DrafterTraits(deterministic=True)

    def __init__(self, vocab_size: int, config: NgramConfig = NgramConfig()) -> None:
        self.vocab_size = vocab_size
        self.config = config
        self.block_size = config.block_size

    def propose(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams]
    ) -> DraftBlock:
        R, K = len(states), min(max_len, self.block_size)
        tokens = torch.zeros(R, K, dtype=torch.long)  # [R, K]
        lengths = torch.zeros(R, dtype=torch.long)  # [R]
        for r, state in enumerate(states):
            if state.lookup_index is None:
                state.lookup_index = TokenPositions()
            found = state.lookup_index.lookup(state.token_ids, K, self.config.min_n, self.config.max_n)
            tokens[r, : len(found)] = torch.tensor(found, dtype=torch.long)
            lengths[r] = len(found)
        return DraftBlock(tokens=tokens, lengths=lengths, probs=None)  # deterministic: one-hot at tokens

    def update(self, state: SequenceState, num_accepted: int, new_features: torch.Tensor | None) -> None:
        """Nothing to absorb: the lookup reads ``state.token_ids`` afresh each round."""
