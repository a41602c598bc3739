"""The static threshold sweep (paper Fig. 5) against hand-counted rounds."""

from __future__ import annotations

import numpy as np
import pytest

from dspark.calibration.collect import ConfidenceRounds
from dspark.calibration.threshold import cut_lengths, threshold_sweep

NAN = np.nan
ROUNDS = ConfidenceRounds(
    confidences=np.array([[0.9, 0.8, 0.3], [0.5, 0.9, 0.9], [0.7, NAN, NAN]]),
    proposed=np.array([3, 3, 1]),
    accepted=np.array([1, 3, 1]),
    group=np.array([0, 1, 2]),
)


def test_cut_lengths_stop_at_the_first_low_confidence():
    assert cut_lengths(ROUNDS, 0.0).tolist() == [3, 3, 1]  # threshold 0 = fixed-length verification
    assert cut_lengths(ROUNDS, 0.6).tolist() == [2, 0, 1]
    assert cut_lengths(ROUNDS, 0.95).tolist() == [0, 0, 0]


def test_sweep_replays_shorter_verification():
    sweep = threshold_sweep(ROUNDS, [0.0, 0.6, 0.95])
    # t=0: kept drafts [1, 3, 1], verified [3, 3, 1]; +1 target token per step.
    assert sweep.accepted_per_step[0] == pytest.approx((2 + 4 + 2) / 3)
    assert sweep.rejected_per_step[0] == pytest.approx((2 + 0 + 0) / 3)
    assert sweep.acceptance_rate[0] == pytest.approx(8 / 10)
    assert sweep.draft_acceptance_rate[0] == pytest.approx(5 / 7)
    # t=0.6: ℓ = [2, 0, 1] → kept [1, 0, 1]
    assert sweep.accepted_per_step[1] == pytest.approx((2 + 1 + 2) / 3)
    assert sweep.rejected_per_step[1] == pytest.approx(1 / 3)
    assert sweep.acceptance_rate[1] == pytest.approx(5 / 6)
    # t=0.95: nothing verified but the target's own token, which is always accepted.
    assert sweep.acceptance_rate[2] == 1.0 and sweep.draft_acceptance_rate[2] is None
