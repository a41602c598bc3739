"""Sequential Temperature Scaling on synthetic over-confident scores with known truth (DESIGN §8)."""

from __future__ import annotations

import numpy as np
import pytest

from dspark.calibration.metrics import position_calibration
from dspark.calibration.sts import apply_sts, compose_temperatures, fit_sts, keep_improving

from .synthetic import synthetic_rounds


@pytest.fixture(scope="module")
def fitted():
    rounds, _ = synthetic_rounds()
    temps = fit_sts(rounds)
    calibrated = rounds.with_confidences(apply_sts(rounds.confidences, temps))
    return rounds, temps, calibrated


def test_sts_brings_the_ece_of_every_survival_product_below_1_5_percent(fitted):
    rounds, temps, calibrated = fitted
    before, after = position_calibration(rounds), position_calibration(calibrated)
    assert min(p.ece for p in before) > 0.03  # the synthetic scores really are over-confident
    for b, a in zip(before, after):
        assert a.ece < 0.015, f"position {a.position}: ECE {a.ece:.4f}"
        assert a.brier < b.brier
    # Reported logits are 2.5× the true ones: STS finds temperatures near 2.5.
    assert all(2.0 < t < 3.1 for t in temps), temps


def test_sts_preserves_the_order_of_scores_and_the_auc(fitted):
    rounds, _, calibrated = fitted
    for k in range(rounds.block_size):
        rows = ~np.isnan(rounds.confidences[:, k])
        raw, cal = rounds.confidences[rows, k], calibrated.confidences[rows, k]
        order = np.argsort(raw, kind="stable")
        assert (np.diff(cal[order]) >= 0).all()  # calibrated scores sorted the same way
    before, after = position_calibration(rounds), position_calibration(calibrated)
    for b, a in zip(before, after):
        assert a.conditional_auc == pytest.approx(b.conditional_auc, abs=1e-12)
    assert after[0].auc == pytest.approx(before[0].auc, abs=1e-12)  # a_1 = c_1


def test_calibrated_scores_are_left_nearly_alone():
    rounds, _ = synthetic_rounds(n=10_000, overconfidence=1.0, seed=1)
    temps = fit_sts(rounds)
    # Deep positions see few survivals, so their ECE is flat in T: only the first ones are pinned.
    assert all(0.8 < t < 1.25 for t in temps[:3]), temps
    before = position_calibration(rounds)
    after = position_calibration(rounds.with_confidences(apply_sts(rounds.confidences, temps)))
    assert all(a.ece <= b.ece + 1e-9 for a, b in zip(after[:1], before[:1]))
    assert all(a.ece < 0.015 for a in after)


def test_temperatures_compose():
    c = np.array([[0.1, 0.6, 0.97]])
    a, b = (2.0, 0.5, 3.0), (1.5, 4.0, 0.5)
    twice = apply_sts(apply_sts(c, a), b)
    assert np.allclose(twice, apply_sts(c, compose_temperatures(a, b)))
    assert compose_temperatures(None, b) == b


def test_a_position_without_rounds_keeps_the_previous_temperature():
    rounds, _ = synthetic_rounds(n=2_000, K=3, seed=2)
    short = rounds.select(rounds.proposed <= 2)
    short = short.with_confidences(short.confidences.copy())
    temps = fit_sts(short)
    assert len(temps) == 3 and temps[2] == temps[1]


def test_only_temperatures_that_lower_the_held_out_ece_are_kept():
    fit, _ = synthetic_rounds(n=10_000, overconfidence=2.5, seed=3)
    held_out, _ = synthetic_rounds(n=10_000, overconfidence=2.5, seed=4)
    temps = fit_sts(fit)
    # The same kind of rounds: every fitted temperature also helps the held-out ones.
    assert keep_improving(held_out, temps) == temps
    # Held-out rounds that were calibrated already: the fitted 2.5s only make them worse.
    calibrated, _ = synthetic_rounds(n=10_000, overconfidence=1.0, seed=5)
    kept = keep_improving(calibrated, temps)
    assert kept[:3] == (1.0, 1.0, 1.0), kept  # deep positions see few survivals: not pinned
    before = position_calibration(calibrated)
    after = position_calibration(calibrated.with_confidences(apply_sts(calibrated.confidences, kept)))
    assert all(a.ece <= b.ece + 1e-6 for a, b in zip(after, before))
    # Mixed: a temperature that harms position 1 is dropped, the others are judged after it.
    wrong_first = (0.2, *temps[1:])
    kept = keep_improving(held_out, wrong_first)
    assert kept[0] == 1.0 and all(t != 1.0 for t in kept[1:3])
    before = position_calibration(held_out)
    after = position_calibration(held_out.with_confidences(apply_sts(held_out.confidences, kept)))
    assert after[0].ece == pytest.approx(before[0].ece, abs=1e-6)  # T = 1 up to the logit clip
    assert np.mean([a.ece for a in after]) < np.mean([b.ece for b in before])
