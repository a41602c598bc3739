"""Calibration and discrimination metrics of probability scores against 0/1 events (DESIGN §8).

Pure functions over numpy arrays ``pred [N]`` in [0, 1] and ``label [N]`` in {0, 1}:

- **ECE** (Naeini et al. 2015) with equal-width bins over [0, 1] (default 20):
  ``Σ_b (n_b / N) · |mean(pred in b) − mean(label in b)|``; a score of exactly 1 falls
  in the last bin;
- **ROC-AUC**: P(score of a random positive > score of a random negative), ties
  counting one half (the Mann–Whitney statistic, Hanley & McNeil 1982); it depends
  only on the order of the scores, so an order-preserving calibration leaves it as is;
- **Brier score**: ``mean((pred − label)²)``;
- **reliability diagram** (paper Fig. 6): per bin, the count, mean prediction and
  observed frequency.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dspark.calibration.collect import ConfidenceRounds

DEFAULT_BINS = 20


def _check(pred: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pred = np.asarray(pred, dtype=np.float64)
    label = np.asarray(label, dtype=np.float64)
    assert pred.shape == label.shape and pred.ndim == 1, f"pred {pred.shape} vs label {label.shape}"
    return pred, label


def bin_index(pred: np.ndarray, bins: int = DEFAULT_BINS) -> np.ndarray:
    """Equal-width bin of each prediction in [0, 1]: ``[N]`` ints in 0..bins−1."""
    return np.clip((np.asarray(pred) * bins).astype(np.int64), 0, bins - 1)


def ece(pred: np.ndarray, label: np.ndarray, bins: int = DEFAULT_BINS) -> float:
    """Expected calibration error with ``bins`` equal-width bins (0.0 for no samples)."""
    pred, label = _check(pred, label)
    if pred.size == 0:
        return 0.0
    idx = bin_index(pred, bins)
    gap = np.abs(np.bincount(idx, pred, bins) - np.bincount(idx, label, bins))  # n_b · |mean p − mean y|
    return float(gap.sum() / pred.size)


def ece_noise(num_rounds: int) -> float:
    """How far an ECE measured on ``num_rounds`` rounds moves by chance: the largest standard
    error of an acceptance rate over that many rounds, ``0.5 / sqrt(n)`` (a binomial at p = ½).
    A change of mean ECE smaller than this is not a change of calibration."""
    return 0.5 / max(num_rounds, 1) ** 0.5


def brier(pred: np.ndarray, label: np.ndarray) -> float:
    """Mean squared error of the probabilities (0.0 for no samples)."""
    pred, label = _check(pred, label)
    return float(np.mean((pred - label) ** 2)) if pred.size else 0.0


def roc_auc(score: np.ndarray, label: np.ndarray) -> float | None:
    """Area under the ROC curve; ``None`` when only one class is present."""
    score, label = _check(score, label)
    pos = label > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    # Average ranks (ties share their mean rank), then the Mann–Whitney U of the positives.
    order = np.argsort(score, kind="mergesort")
    sorted_scores = score[order]
    ranks = np.empty(score.size, dtype=np.float64)
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], score.size]
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = 0.5 * (s + e - 1) + 1.0
    u = ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


@dataclass(frozen=True)
class Reliability:
    """A reliability diagram: per equal-width bin, what was predicted and what happened."""

    edges: list[float]  # [bins + 1]
    count: list[int]  # [bins]
    mean_predicted: list[float | None]  # [bins], None for an empty bin
    observed: list[float | None]  # [bins] frequency of the event, None for an empty bin


def reliability(pred: np.ndarray, label: np.ndarray, bins: int = DEFAULT_BINS) -> Reliability:
    pred, label = _check(pred, label)
    idx = bin_index(pred, bins)
    count = np.bincount(idx, minlength=bins)
    sum_p = np.bincount(idx, pred, bins)
    sum_y = np.bincount(idx, label, bins)
    return Reliability(
        edges=[b / bins for b in range(bins + 1)],
        count=count.tolist(),
        mean_predicted=[float(p / n) if n else None for p, n in zip(sum_p, count)],
        observed=[float(y / n) if n else None for y, n in zip(sum_y, count)],
    )


@dataclass(frozen=True)
class PositionCalibration:
    """How well the confidences of draft position k score the rounds (module docstring).

    ``ece``/``brier``/``auc``/``reliability`` judge the survival product ``a_k`` against
    "first k accepted" (what STS calibrates); ``conditional_*`` judge ``c_k`` alone
    against "draft k accepted" where drafts 1..k−1 were.
    """

    position: int  # k, from 1
    num_rounds: int  # rounds that proposed >= k drafts
    mean_predicted: float | None
    observed: float | None  # frequency of "first k accepted"
    ece: float
    brier: float
    auc: float | None
    conditional_ece: float
    conditional_auc: float | None
    reliability: Reliability


def position_calibration(rounds: ConfidenceRounds, bins: int = DEFAULT_BINS) -> list[PositionCalibration]:
    """:class:`PositionCalibration` of every position 1..K of ``rounds``."""
    out = []
    for k in range(1, rounds.block_size + 1):
        a_k, survived = rounds.survival_events(k)
        c_k, accepted = rounds.conditional_events(k)
        out.append(
            PositionCalibration(
                position=k,
                num_rounds=int(a_k.size),
                mean_predicted=float(a_k.mean()) if a_k.size else None,
                observed=float(survived.mean()) if a_k.size else None,
                ece=ece(a_k, survived, bins),
                brier=brier(a_k, survived),
                auc=roc_auc(a_k, survived),
                conditional_ece=ece(c_k, accepted, bins),
                conditional_auc=roc_auc(c_k, accepted),
                reliability=reliability(a_k, survived, bins),
            )
        )
    return out
