"""Static confidence-threshold sweep (paper §4.3.3, Fig. 5; DESIGN §12).

For a threshold t, a round verifies the drafts before the first ``c_k < t`` (the
``threshold:t`` policy, DESIGN §9): ``ℓ = #leading positions with c_k ≥ t``. The sweep
replays rounds that were verified in full: since whether draft k survives depends only
on drafts 1..k, verifying the first ℓ of them would have accepted ``min(accepted, ℓ)``,
so the replay is exact per round.

Per step (= round), as the paper counts them (its footnote 3: the target's own
recovered/bonus token is included in accepted lengths and acceptance rates):

- accepted tokens = ``min(accepted, ℓ) + 1``; rejected tokens = ``ℓ − min(accepted, ℓ)``
  (verified drafts the target threw away); their sum is the ``ℓ + 1`` positions verified;
- acceptance rate = Σ accepted tokens / Σ (ℓ + 1); threshold 0 is fixed-length
  verification.

``draft_acceptance_rate`` = Σ min(accepted, ℓ) / Σ ℓ leaves the target's token out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dspark.calibration.collect import ConfidenceRounds

DEFAULT_THRESHOLDS = tuple(round(0.1 * i, 1) for i in range(10))  # 0.0 .. 0.9


def cut_lengths(rounds: ConfidenceRounds, threshold: float) -> np.ndarray:
    """``ℓ [N]``: the proposed drafts before the first confidence below ``threshold``."""
    K = rounds.block_size
    positions = np.arange(K)[None, :]  # [1, K]
    keep = (rounds.confidences >= threshold) & (positions < rounds.proposed[:, None])  # [N, K]; NaN fails
    # Length of the leading run of True: the index of the first False (K if none).
    return np.where(keep.all(axis=1), K, np.argmin(keep, axis=1)).astype(np.int64)


@dataclass(frozen=True)
class ThresholdSweep:
    """Per threshold: mean tokens per step and acceptance rates (module docstring)."""

    num_rounds: int
    thresholds: list[float]
    accepted_per_step: list[float]  # incl. the target's own token
    rejected_per_step: list[float]
    acceptance_rate: list[float | None]  # incl. the target's own token
    draft_acceptance_rate: list[float | None]  # drafts only


def threshold_sweep(
    rounds: ConfidenceRounds, thresholds: Sequence[float] = DEFAULT_THRESHOLDS
) -> ThresholdSweep:
    n = rounds.num_rounds
    accepted, rejected, rate, draft_rate = [], [], [], []
    for t in thresholds:
        ell = cut_lengths(rounds, t)  # [N]
        kept = np.minimum(rounds.accepted, ell)  # [N] accepted drafts had only ℓ been verified
        accepted.append(float((kept + 1).mean()) if n else 0.0)
        rejected.append(float((ell - kept).mean()) if n else 0.0)
        rate.append(float((kept + 1).sum() / (ell + 1).sum()) if n else None)
        draft_rate.append(float(kept.sum() / ell.sum()) if ell.sum() else None)
    return ThresholdSweep(n, [float(t) for t in thresholds], accepted, rejected, rate, draft_rate)
