"""Confidences for drafters without a confidence head, learned online from verification.

The hardware-aware policies rank drafts by predicted conditional acceptance ``c_k``
(DESIGN §2). DSpark's head supplies it; for every other drafter (n-gram, DFlash, Eagle3)
this estimator predicts it from the draft distribution and recalibrates against what
the target actually accepted.

Feature: the peak ``max_v p_d^k(v)`` of the distribution draft k was sampled from
(``DraftBlock.peaks``; 1 for a one-hot draft) — a
function of ``x_<k`` only, never of ``x_k`` itself. (Using ``p_d^k(x_k)`` would let the
admission of ``x_k`` depend on its own value and bias the output, paper Appendix A.)

Model: per position k and per peak bin, exponentially decayed counts of (tested,
accepted) at that position, shrunk towards the position's pooled rate, which is shrunk
towards a prior. Position k is *tested* in a round when it was verified and every draft
before it was accepted; it *succeeds* when it is accepted too (conditional acceptance,
DESIGN §2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, kw_only=True)
class EstimatorConfig:
    bins: int = 10  # equal-width bins of the peak draft probability
    decay: float = 0.999  # per observed round; ~1000 rounds of memory
    # Conditional acceptance assumed before any evidence. Optimistic on purpose: the
    # estimate learns only from verified positions, and a pessimistic start can make a
    # hardware-aware policy verify nothing, ever. Decay pulls long-unverified cells back.
    prior: float = 0.8
    prior_strength: float = 2.0  # pseudo-rounds behind the prior
    pool_strength: float = 4.0  # pseudo-rounds pulling a bin towards its position's rate


def round_outcomes(lengths: Tensor, num_accepted: Tensor, K: int) -> tuple[Tensor, Tensor]:
    """Which positions a round tested and which it accepted, ``[R, K]`` bool each."""
    k = torch.arange(K).unsqueeze(0)  # [1, K], 0-based
    verified = k < lengths.unsqueeze(-1)  # [R, K]
    tested = verified & (k <= num_accepted.unsqueeze(-1))  # everything before k accepted
    accepted = k < num_accepted.unsqueeze(-1)
    return tested, accepted


class ConfidenceEstimator:
    """Online calibrated ``c_k`` for drafts, from their peak probability and position."""

    def __init__(self, block_size: int, config: EstimatorConfig = EstimatorConfig()) -> None:
        self.config = config
        self.block_size = block_size
        self.tested = torch.zeros(block_size, config.bins, dtype=torch.float64)  # [K, bins]
        self.accepted = torch.zeros(block_size, config.bins, dtype=torch.float64)  # [K, bins]

    def _bins(self, features: Tensor) -> Tensor:
        return (features.clamp(0.0, 1.0) * self.config.bins).long().clamp_max(self.config.bins - 1)

    def position_rates(self) -> Tensor:
        """Pooled conditional acceptance per position ``[K]``, shrunk to the prior."""
        c = self.config
        return (self.accepted.sum(-1) + c.prior * c.prior_strength) / (self.tested.sum(-1) + c.prior_strength)

    def table(self) -> Tensor:
        """Current estimate per (position, bin) ``[K, bins]``."""
        pooled = self.position_rates().unsqueeze(-1)  # [K, 1]
        s = self.config.pool_strength
        return (self.accepted + s * pooled) / (self.tested + s)

    def predict(self, features: Tensor) -> Tensor:
        """Confidences ``[R, K']`` for peak features ``[R, K']`` (K' <= block size)."""
        K = features.shape[1]
        assert self.block_size >= K, f"{K} positions for an estimator of block size {self.block_size}"
        table = self.table()[:K]  # [K, bins]
        bins = self._bins(features.cpu())  # [R, K]
        return table.gather(1, bins.T).T.float()  # [R, K]

    def observe(self, features: Tensor, lengths: Tensor, num_accepted: Tensor) -> None:
        """Recalibrate on verified rounds: ``features [R, K]``, ``lengths``/``num_accepted [R]``."""
        R, K = features.shape
        # Decay even when nothing was verified, so estimates drift back to the prior and
        # positions the scheduler stopped verifying get tried again.
        self.tested.mul_(self.config.decay**R)
        self.accepted.mul_(self.config.decay**R)
        if R == 0 or K == 0:
            return
        tested, accepted = round_outcomes(lengths.cpu(), num_accepted.cpu(), K)
        bins = self._bins(features.cpu())  # [R, K]
        flat = (torch.arange(K).unsqueeze(0) * self.config.bins + bins)[tested]  # [n] cell index
        self.tested.view(-1).index_add_(0, flat, torch.ones(flat.shape[0], dtype=torch.float64))
        self.accepted.view(-1).index_add_(0, flat, accepted[tested].double())
