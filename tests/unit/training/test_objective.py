"""Drafter losses and metrics against hand-computed values (DESIGN §6; paper Eqs. 9-12)."""

from __future__ import annotations

import math

import pytest
import torch

from dspark.drafters.dflash import DFlashConfig
from dspark.drafters.dspark import DSparkConfig
from dspark.drafters.eagle3 import Eagle3Config
from dspark.drafters.objective_config import ObjectiveConfig
from dspark.protocols import TrainOutput
from dspark.training.objective import (
    binary_cross_entropy,
    compute_loss,
    cross_entropy,
    draft_metrics,
    drafter_loss,
    l1_distance,
    position_weights,
    soft_acceptance_label,
    soft_cross_entropy,
    weighted_mean,
)

LOG = math.log


def test_position_weights():
    torch.testing.assert_close(
        position_weights(3, decay=4.0), torch.tensor([1.0, math.exp(-0.25), math.exp(-0.5)])
    )
    torch.testing.assert_close(position_weights(3, geometric=0.8), torch.tensor([1.0, 0.8, 0.64]))


def test_weighted_mean_counts_valid_slots_only():
    values = torch.tensor([[[1.0, 2.0, 100.0]], [[3.0, 100.0, 100.0]]])  # [B=2, A=1, K=3]
    valid = torch.tensor([[[True, True, False]], [[True, False, False]]])
    w = torch.tensor([1.0, 0.5, 0.25])
    assert float(weighted_mean(values, valid, w)) == pytest.approx((1 + 0.5 * 2 + 3) / (1 + 0.5 + 1))


def test_per_slot_terms():
    p_d = torch.tensor([0.5, 0.5, 0.0])
    p_t = torch.tensor([0.25, 0.25, 0.5])
    assert float(l1_distance(p_d, p_t)) == pytest.approx(1.0)
    assert float(soft_acceptance_label(p_d, p_t)) == pytest.approx(0.5)  # = Σ min(p_d, p_t)
    logits = torch.log(torch.tensor([0.2, 0.3, 0.5]))
    assert float(cross_entropy(logits, torch.tensor(2))) == pytest.approx(-LOG(0.5))
    target_logits = torch.log(torch.tensor([0.5, 0.5, 0.0]) + 1e-30)
    expected_soft = -(0.5 * LOG(0.2) + 0.5 * LOG(0.3))
    assert float(soft_cross_entropy(logits, target_logits)) == pytest.approx(expected_soft, rel=1e-5)
    bce = -(0.5 * LOG(0.8) + 0.5 * LOG(0.2))
    assert float(binary_cross_entropy(torch.tensor(0.8), torch.tensor(0.5))) == pytest.approx(bce, rel=1e-5)


def test_soft_label_is_one_minus_half_l1_and_detached():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 4, 7, requires_grad=True)
    p_d, p_t = torch.softmax(logits, -1), torch.softmax(torch.randn(2, 3, 4, 7), -1)
    label = soft_acceptance_label(p_d, p_t)
    assert not label.requires_grad
    torch.testing.assert_close(label, 1 - 0.5 * (p_d - p_t).abs().sum(-1))
    torch.testing.assert_close(label, torch.minimum(p_d, p_t).sum(-1))  # Leviathan et al.


def tiny_output(confidences: bool = True) -> TrainOutput:
    """B=1, A=1, K=2, V=2 with known distributions; the second slot is valid."""
    p_d = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
    p_t = torch.tensor([[1.0, 0.0], [0.6, 0.4]])
    return TrainOutput(
        logits=torch.log(p_d).view(1, 1, 2, 2),
        labels=torch.tensor([[[0, 1]]]),
        target_logits=torch.log(p_t + 1e-30).view(1, 1, 2, 2),
        valid=torch.tensor([[[True, True]]]),
        confidences=torch.tensor([[[0.6, 0.5]]]) if confidences else None,
    )


def test_dspark_total_by_hand():
    out = tiny_output()
    w1, w2 = 1.0, math.exp(-1 / 4.0)
    ce = (w1 * -LOG(0.5) + w2 * -LOG(0.1)) / (w1 + w2)
    tv = (w1 * 1.0 + w2 * 0.6) / (w1 + w2)  # ‖p_d - p_t‖₁ = 1.0, 0.6
    c_star = (0.5, 0.7)
    bce = [-(c * LOG(p) + (1 - c) * LOG(1 - p)) for c, p in zip(c_star, (0.6, 0.5))]
    conf = (w1 * bce[0] + w2 * bce[1]) / (w1 + w2)
    result = compute_loss(out, DSparkConfig().objective)
    assert float(result.ce) == pytest.approx(ce, rel=1e-5)
    assert float(result.tv) == pytest.approx(tv, rel=1e-5)
    assert float(result.conf) == pytest.approx(conf, rel=1e-5)
    assert float(result.loss) == pytest.approx(0.1 * ce + 0.9 * tv + 1.0 * conf, rel=1e-5)
    assert result.soft_ce is None
    m = result.metrics
    torch.testing.assert_close(m.acceptance, torch.tensor([0.5, 0.7]))
    assert m.expected_tau == pytest.approx(1 + 0.5 + 0.5 * 0.7)
    assert m.confidence_bias == pytest.approx(((0.6 - 0.5) + (0.5 - 0.7)) / 2)


def test_dflash_is_ce_only_and_eagle3_soft_ce_with_geometric_weights():
    out = tiny_output(confidences=False)
    dflash = drafter_loss(DFlashConfig(), out)
    assert dflash.tv is None and dflash.conf is None
    assert float(dflash.loss) == pytest.approx(float(dflash.ce))
    eagle = drafter_loss(Eagle3Config(), out)
    soft = [-(1.0 * LOG(0.5)), -(0.6 * LOG(0.9) + 0.4 * LOG(0.1))]
    assert float(eagle.loss) == pytest.approx((soft[0] + 0.8 * soft[1]) / 1.8, rel=1e-5)
    assert eagle.ce is None and eagle.metrics.confidence_bias is None


def test_invalid_slots_do_not_count():
    out = tiny_output()
    out.valid[0, 0, 1] = False
    before = float(compute_loss(out, DSparkConfig().objective).loss)
    out.logits[0, 0, 1] = torch.tensor([5.0, -5.0])
    out.confidences[0, 0, 1] = 0.01
    assert float(compute_loss(out, DSparkConfig().objective).loss) == pytest.approx(before)


def test_metrics_stop_at_positions_without_data():
    p = torch.full((1, 2, 3, 2), 0.5)
    valid = torch.tensor([[[True, False, False], [True, False, False]]])
    m = draft_metrics(p, p, valid)
    assert m.acceptance[0] == 1.0 and m.acceptance[1:].isnan().all()
    assert m.expected_tau == pytest.approx(2.0)


def test_confidence_objective_needs_confidences():
    with pytest.raises(ValueError, match="confidence"):
        compute_loss(tiny_output(confidences=False), DSparkConfig().objective)
    with pytest.raises(ValueError):
        ObjectiveConfig(ce=1.0, decay=4.0, geometric=0.8)
