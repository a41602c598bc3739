"""The quickstart report says in words what its figures mean (faster or slower, calibration
beyond noise, ratios drafting cannot produce)."""

from __future__ import annotations

from dspark.calibration.metrics import ece_noise
from dspark.pipeline.quickstart.verdicts import (
    BEYOND_TAU,
    beyond_tau,
    calibration_verdict,
    speed_verdict,
    speedup_cell,
)


def means(**speedups):
    return {m: {"tau": 2.0, "speedup": s} for m, s in speedups.items()}


def test_the_verdict_says_slower_when_no_trained_drafter_pays():
    text = speed_verdict(means(dflash=0.93, dspark=0.87, eagle3=0.82, ngram=1.4, **{"dspark-shipped": 1.5}))
    assert "made the target slower" in text and "dflash 0.93×" in text
    assert "ngram" not in text and "shipped" not in text  # references are not this run's drafters


def test_the_verdict_names_the_drafters_that_pay():
    assert "made the target faster" in speed_verdict(means(dflash=1.1, dspark=1.3))
    mixed = speed_verdict(means(dflash=0.9, dspark=1.3))
    assert "only dspark made the target faster" in mixed and "best dspark" in mixed


def test_a_speedup_above_tau_is_flagged():
    assert beyond_tau(1.50, 1.13) and speedup_cell(1.50, 1.13) == f"1.50×{BEYOND_TAU}"
    assert not beyond_tau(1.10, 1.13) and speedup_cell(1.10, 1.13) == "1.10×"
    assert speedup_cell(None, 1.2) == "–"


def test_calibration_is_improved_only_beyond_noise():
    n = 377
    assert ece_noise(n) == 0.5 / n**0.5  # ≈ 2.6 points
    small = {"mean_ece_before": 0.01666, "mean_ece_after": 0.01647, "report_rounds": n}
    assert calibration_verdict(small).startswith("unchanged within noise")
    large = {"mean_ece_before": 0.10, "mean_ece_after": 0.02, "report_rounds": n}
    assert calibration_verdict(large) == "improved beyond noise"
    worse = {"mean_ece_before": 0.02, "mean_ece_after": 0.10, "report_rounds": n}
    assert calibration_verdict(worse) == "worse beyond noise"
    # a 2.0 % → 1.6 % change is noise on 377 rounds (± 2.6 points), not on 100,000 (± 0.16 points)
    assert calibration_verdict(dict(small, mean_ece_before=0.02)).startswith("unchanged")
    many = dict(small, mean_ece_before=0.02, report_rounds=100_000)
    assert calibration_verdict(many) == "improved beyond noise"
