"""Synthetic rounds whose true conditional acceptance probabilities are known."""

from __future__ import annotations

import numpy as np

from dspark.calibration.collect import ConfidenceRounds
from dspark.calibration.sts import sigmoid


def synthetic_rounds(
    n: int = 20_000, K: int = 7, *, overconfidence: float = 2.5, seed: int = 0
) -> tuple[ConfidenceRounds, np.ndarray]:
    """Rounds drafted with true logits z [n, K]; the reported confidences are σ(overconfidence · z).

    Draft k is accepted with probability σ(z_k) given drafts 1..k−1 were (the
    sequential process of rejection sampling); a fifth of the rounds propose fewer than
    K drafts. Returns the rounds and the true conditional probabilities.
    """
    rng = np.random.default_rng(seed)
    z = rng.normal(0.8, 1.5, (n, K)) + np.linspace(0.5, -0.5, K)  # later drafts a little harder
    true = sigmoid(z)
    proposed = np.where(rng.random(n) < 0.2, rng.integers(1, K + 1, n), K)
    survives = rng.random((n, K)) < true
    accepted = np.minimum(np.argmin(np.c_[survives, np.zeros(n, bool)], axis=1), proposed)
    conf = sigmoid(overconfidence * z)
    conf[np.arange(K)[None, :] >= proposed[:, None]] = np.nan
    group = np.arange(n) // 10
    return ConfidenceRounds(conf, proposed.astype(np.int64), accepted.astype(np.int64), group), true
