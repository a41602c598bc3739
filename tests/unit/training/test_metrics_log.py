"""Training metrics: flattening loss outputs, NaN-aware means, JSONL and progress (DESIGN §6)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

import pytest
import torch

from dspark.training.metrics_log import MetricMeans, MetricsLog, flatten_metrics


@dataclass(frozen=True)
class _Inner:
    acceptance: torch.Tensor
    expected_tau: float
    confidence_bias: float | None


@dataclass(frozen=True)
class _Outer:
    loss: torch.Tensor
    tv: torch.Tensor | None
    flag: bool
    metrics: _Inner


def test_flatten_metrics():
    """Nested dataclasses inline, vectors per position (1-based), None and flags skipped, detached."""
    out = _Outer(
        torch.tensor(1.5, requires_grad=True), None, True, _Inner(torch.tensor([0.9, 0.8]), 2.5, None)
    )
    flat = flatten_metrics(out)
    assert flat == pytest.approx({"loss": 1.5, "acceptance/1": 0.9, "acceptance/2": 0.8, "expected_tau": 2.5})
    assert all(type(v) is float for v in flat.values())


def test_means_skip_non_finite_values():
    means = MetricMeans()
    means.add({"a": 1.0, "b": math.nan, "c": math.nan})
    means.add({"a": 3.0, "b": 2.0, "c": math.inf})
    got = means.reduce()
    assert got["a"] == 2.0 and got["b"] == 2.0 and math.isnan(got["c"])


def test_jsonl_records_resume_truncation_and_missing_tensorboard(tmp_path, caplog):
    log = MetricsLog(tmp_path, total_steps=4, progress=False)
    for step in (1, 2, 3):
        log.write(step, {"loss": 0.5, "acceptance/3": math.nan})
        log.advance({"loss": 0.5})
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert (
        [r["step"] for r in rows] == [1, 2, 3] and rows[0]["acceptance/3"] is None and rows[0]["loss"] == 0.5
    )
    with caplog.at_level(logging.WARNING):  # resumed from step 2: step 3's row is redone
        resumed = MetricsLog(tmp_path, total_steps=4, start_step=2, tensorboard=True, progress=False)
    if resumed._tb is None:
        assert "tensorboard is not installed" in caplog.text
    resumed.write(3, {"loss": 0.25})
    resumed.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 0.5), (2, 0.5), (3, 0.25)]


def test_other_ranks_write_nothing(tmp_path):
    log = MetricsLog(tmp_path / "run", total_steps=2, enabled=False)
    log.write(1, {"loss": 1.0})
    log.advance()
    log.close()
    assert not (tmp_path / "run").exists()
