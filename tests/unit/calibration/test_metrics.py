"""ECE, ROC-AUC, Brier and reliability against hand-computed values and scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from dspark.calibration.metrics import brier, ece, reliability, roc_auc


def test_ece_by_hand():
    pred = np.array([0.1, 0.1, 0.9, 0.9])
    label = np.array([0, 1, 1, 1])
    # bin [0.10, 0.15): |0.1 - 0.5| · 2/4; bin [0.90, 0.95): |0.9 - 1| · 2/4
    assert ece(pred, label, bins=20) == pytest.approx(0.2 + 0.05)
    # A perfectly calibrated constant score has no error; a score of exactly 1 is binned.
    assert ece(np.full(10, 0.3), np.array([1, 1, 1] + [0] * 7)) == pytest.approx(0.0)
    assert ece(np.array([1.0, 1.0]), np.array([1, 0])) == pytest.approx(0.5)
    assert ece(np.array([]), np.array([])) == 0.0


def test_roc_auc_by_hand_and_against_mann_whitney():
    assert roc_auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(0.75)
    assert roc_auc(np.full(6, 0.5), np.array([0, 1, 0, 1, 1, 0])) == pytest.approx(0.5)  # ties count half
    assert roc_auc(np.array([0.2, 0.3]), np.array([1, 1])) is None
    rng = np.random.default_rng(0)
    score = rng.integers(0, 20, 500) / 20  # many ties
    label = (rng.random(500) < score).astype(float)
    u = mannwhitneyu(score[label == 1], score[label == 0]).statistic
    assert roc_auc(score, label) == pytest.approx(u / ((label == 1).sum() * (label == 0).sum()))


def test_brier_and_reliability():
    pred, label = np.array([0.2, 0.8, 0.8, 1.0]), np.array([0, 1, 0, 1])
    assert brier(pred, label) == pytest.approx((0.04 + 0.04 + 0.64 + 0.0) / 4)
    rel = reliability(pred, label, bins=5)
    assert rel.count == [0, 1, 0, 0, 3]
    assert rel.mean_predicted[0] is None and rel.observed[1] == 0.0
    assert rel.mean_predicted[4] == pytest.approx(2.6 / 3) and rel.observed[4] == pytest.approx(2 / 3)
