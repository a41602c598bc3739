"""Real speculative rounds with the drafter's confidences: what calibration learns from (DESIGN §8).

:class:`RoundRecorder` is the decoding loop's ``on_round`` hook: per round it keeps the
confidences ``c_1..c_K`` of the verified drafts and how many were accepted.
:class:`ConfidenceRounds` holds many such rounds as arrays and turns them into the two
kinds of events the metrics score:

- **survival at k** (what STS calibrates, and what the prefix scheduler consumes):
  prediction ``a_k = Π_{i≤k} c_i`` against "the first k drafts were all accepted", over
  the rounds that proposed ≥ k drafts;
- **conditional at k** (what the confidence head predicts, paper Eq. 7): prediction
  ``c_k`` against "draft k accepted", over the rounds that reached draft k (≥ k−1
  accepted) and proposed it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dspark.protocols import DraftBlock


@dataclass(frozen=True)
class ConfidenceRounds:
    """N rounds of block size K; ``confidences[n, k]`` is NaN where draft k+1 was not proposed."""

    confidences: np.ndarray  # [N, K] float64
    proposed: np.ndarray  # [N] int64
    accepted: np.ndarray  # [N] int64
    group: np.ndarray  # [N] int64: the prompt each round belongs to (splits keep prompts whole)

    def __post_init__(self) -> None:
        N = self.proposed.shape[0]
        assert self.confidences.ndim == 2 and self.confidences.shape[0] == N, (
            f"confidences {self.confidences.shape} vs {N} rounds"
        )
        assert self.accepted.shape == (N,) and self.group.shape == (N,)
        assert (self.accepted <= self.proposed).all() and (self.proposed <= self.block_size).all()

    @property
    def num_rounds(self) -> int:
        return int(self.proposed.shape[0])

    @property
    def block_size(self) -> int:
        return int(self.confidences.shape[1])

    @staticmethod
    def concat(parts: Sequence[ConfidenceRounds], block_size: int) -> ConfidenceRounds:
        """All rounds of ``parts``, padded to ``block_size`` positions."""
        if not parts:
            return ConfidenceRounds(
                np.zeros((0, block_size)), *(np.zeros(0, dtype=np.int64) for _ in range(3))
            )
        width = max(block_size, *(p.block_size for p in parts))
        conf = [
            np.pad(p.confidences, ((0, 0), (0, width - p.block_size)), constant_values=np.nan) for p in parts
        ]
        return ConfidenceRounds(
            np.concatenate(conf),
            np.concatenate([p.proposed for p in parts]),
            np.concatenate([p.accepted for p in parts]),
            np.concatenate([p.group for p in parts]),
        )

    def select(self, mask: np.ndarray) -> ConfidenceRounds:
        """The rounds where ``mask [N]`` is true."""
        return ConfidenceRounds(
            self.confidences[mask], self.proposed[mask], self.accepted[mask], self.group[mask]
        )

    def with_confidences(self, confidences: np.ndarray) -> ConfidenceRounds:
        """The same rounds scored by other confidences (e.g. after STS)."""
        assert confidences.shape == self.confidences.shape
        return ConfidenceRounds(confidences, self.proposed, self.accepted, self.group)

    def survival_events(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(a_k, first k accepted)`` over the rounds that proposed ≥ k drafts (k from 1)."""
        rows = self.proposed >= k
        a_k = np.prod(self.confidences[rows, :k], axis=1)  # [n]
        return a_k, (self.accepted[rows] >= k).astype(np.float64)

    def conditional_events(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(c_k, draft k accepted)`` over the rounds that reached and proposed draft k."""
        rows = (self.proposed >= k) & (self.accepted >= k - 1)
        return self.confidences[rows, k - 1], (self.accepted[rows] >= k).astype(np.float64)


class RoundRecorder:
    """``on_round`` hook of :func:`dspark.decoding.speculative_generate` for one request.

    Rounds without confidences (drafters with no confidence head) or without drafts are
    not recorded.
    """

    def __init__(self, group: int = 0) -> None:
        self.group = group
        self._rows: list[tuple[list[float], int]] = []

    def __call__(self, block: DraftBlock, num_accepted: int) -> None:
        k = int(block.lengths[0])
        if block.confidences is None or k == 0:
            return
        self._rows.append((block.confidences[0, :k].double().tolist(), num_accepted))

    def rounds(self, block_size: int) -> ConfidenceRounds:
        conf = np.full((len(self._rows), block_size), np.nan)
        for n, (c, _) in enumerate(self._rows):
            conf[n, : len(c)] = c
        return ConfidenceRounds(
            conf,
            np.array([len(c) for c, _ in self._rows], dtype=np.int64),
            np.array([a for _, a in self._rows], dtype=np.int64),
            np.full(len(self._rows), self.group, dtype=np.int64),
        )


def split_by_group(
    rounds: ConfidenceRounds, holdout_fraction: float, seed: int = 0
) -> tuple[ConfidenceRounds, ConfidenceRounds]:
    """``(fit, holdout)``: a seeded ``holdout_fraction`` of the groups (prompts) goes to holdout.

    Whole prompts move, so rounds of one answer — which are correlated — never sit on
    both sides. With a fraction of 0, or too few prompts for both sides to get one,
    both sides are all the rounds.
    """
    groups = np.unique(rounds.group)
    n_holdout = int(round(holdout_fraction * groups.size))
    if n_holdout == 0 or n_holdout >= groups.size:
        return rounds, rounds
    held = np.random.default_rng(seed).permutation(groups)[:n_holdout]
    mask = np.isin(rounds.group, held)
    return rounds.select(~mask), rounds.select(mask)
