"""Sequential Temperature Scaling (STS, paper §3.2.1, DESIGN §8).

Each confidence ``c_k`` estimates a *conditional* acceptance, so by the chain rule the
probability that the first k drafts all survive is the product ``a_k = Π_{i≤k} c_i``,
which is what the prefix scheduler needs in absolute terms. STS calibrates these
products left to right: for k = 1..K, with ``c_1..c_{k−1}`` already calibrated and held
fixed, a 1-D grid search picks the temperature ``T_k`` (``c_k = σ(logit_k / T_k)``) that
minimises the ECE of ``a_k`` against the realised event "first k accepted", over the
rounds that proposed ≥ k drafts.

Dividing a logit by a positive ``T_k`` is strictly increasing, so the order of the
``c_k`` scores — and any metric of that order, like the ROC-AUC of ``c_k`` — is
unchanged; only their magnitudes move.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from dspark.calibration.collect import ConfidenceRounds
from dspark.calibration.metrics import DEFAULT_BINS, bin_index, ece

# 241 log-spaced temperatures from 1/20 to 20; T = 1 (no change) is the middle point.
DEFAULT_GRID = np.exp(np.linspace(np.log(0.05), np.log(20.0), 241))
log = logging.getLogger(__name__)
_EPS = 1e-7  # keep logits finite for scores that fp32 sigmoid rounded to 0 or 1


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
    return np.log(p) - np.log1p(-p)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # = 1 / (1 + e^{-z}) without overflow


def apply_sts(confidences: np.ndarray, temperatures: Sequence[float]) -> np.ndarray:
    """``σ(logit(c_k) / T_k)`` for confidences ``[..., K]``; positions past the temperatures keep the last."""
    K = confidences.shape[-1]
    t = list(temperatures[:K]) + [temperatures[-1]] * max(0, K - len(temperatures))
    return sigmoid(logit(confidences) / np.asarray(t, dtype=np.float64))


def compose_temperatures(first: Sequence[float] | None, then: Sequence[float]) -> tuple[float, ...]:
    """Temperatures equivalent to scaling by ``first`` and then by ``then``: ``T = T_first · T_then``.

    Calibrating a drafter that already has temperatures fits ``then`` on the confidences
    it reports, which ``first`` already scaled.
    """
    if not first:
        return tuple(float(t) for t in then)
    padded = list(first) + [first[-1]] * max(0, len(then) - len(first))
    return tuple(float(a * b) for a, b in zip(padded, then))


def _ece_over_grid(
    prefix: np.ndarray, z: np.ndarray, label: np.ndarray, grid: np.ndarray, bins: int
) -> np.ndarray:
    """ECE of ``prefix · σ(z / T)`` against ``label`` for every T of ``grid``: ``[G]``."""
    n = z.size
    out = np.empty(grid.size)
    for start in range(0, grid.size, 32):  # chunks of the grid keep memory at 32·n
        t = grid[start : start + 32, None]  # [g, 1]
        pred = prefix[None, :] * sigmoid(z[None, :] / t)  # [g, n]
        g = pred.shape[0]
        idx = bin_index(pred, bins) + bins * np.arange(g)[:, None]  # [g, n]: one bin range per T
        sum_p = np.bincount(idx.ravel(), pred.ravel(), g * bins).reshape(g, bins)
        sum_y = np.bincount(idx.ravel(), np.broadcast_to(label, pred.shape).ravel(), g * bins).reshape(
            g, bins
        )
        out[start : start + g] = np.abs(sum_p - sum_y).sum(axis=1) / n
    return out


def fit_sts(
    rounds: ConfidenceRounds, *, grid: np.ndarray = DEFAULT_GRID, bins: int = DEFAULT_BINS
) -> tuple[float, ...]:
    """The STS temperatures ``(T_1..T_K)`` of ``rounds`` (module docstring).

    Among equally good temperatures the one closest to 1 wins (the smallest change); a
    position no round proposed keeps the previous temperature (1 at position 1).
    """
    grid = np.asarray(grid, dtype=np.float64)
    assert grid.ndim == 1 and grid.size > 0 and (grid > 0).all(), "the grid must hold positive temperatures"
    logits = logit(rounds.confidences)  # [N, K]; NaN past the proposed drafts
    calibrated = rounds.confidences.copy()  # [N, K]: c_1..c_{k-1} already scaled
    temperatures: list[float] = []
    closeness = np.abs(np.log(grid))
    for k in range(1, rounds.block_size + 1):
        rows = rounds.proposed >= k
        if not rows.any():
            temperatures.append(temperatures[-1] if temperatures else 1.0)
            continue
        prefix = np.prod(calibrated[rows, : k - 1], axis=1)  # [n]: Π_{i<k} c_i, calibrated
        label = (rounds.accepted[rows] >= k).astype(np.float64)  # [n]: first k accepted
        eces = _ece_over_grid(prefix, logits[rows, k - 1], label, grid, bins)
        best = np.flatnonzero(eces <= eces.min() + 1e-12)
        t_k = float(grid[best[np.argmin(closeness[best])]])
        if t_k in (grid.min(), grid.max()):
            log.warning("STS temperature of position %d is at the edge of the grid (%.3g)", k, t_k)
        temperatures.append(t_k)
        calibrated[:, k - 1] = sigmoid(logits[:, k - 1] / t_k)
    return tuple(temperatures)


def keep_improving(
    rounds: ConfidenceRounds, temperatures: Sequence[float], *, bins: int = DEFAULT_BINS
) -> tuple[float, ...]:
    """``temperatures`` with every one that does not lower its position's ECE on ``rounds`` set to 1.

    Left to right like the fit: position k keeps ``T_k`` only if, with the temperatures
    already kept for 1..k−1, the ECE of ``a_k`` on ``rounds`` (the held-out ones) is
    strictly lower with ``T_k`` than without it. A temperature fitted on one part of the
    rounds that makes the other part worse calibrated is noise, not a calibration, and
    is not written into a drafter.
    """

    K = rounds.block_size
    kept = [1.0] * K

    def ece_at(k: int, temps: list[float]) -> float:
        scaled = rounds.with_confidences(apply_sts(rounds.confidences, temps))
        a_k, survived = scaled.survival_events(k)
        return ece(a_k, survived, bins)

    for k in range(1, K + 1):
        candidate = kept[: k - 1] + [float(temperatures[k - 1])] + kept[k:]
        if candidate[k - 1] != 1.0 and ece_at(k, candidate) < ece_at(k, kept) - 1e-12:
            kept = candidate
    return tuple(kept)
