"""Online confidences for drafters without a confidence head."""

from __future__ import annotations

import torch

from dspark.protocols import DraftBlock
from dspark.scheduler import ConfidenceEstimator
from dspark.scheduler.confidence_estimator import round_outcomes


def test_round_outcomes_follow_conditional_acceptance():
    lengths = torch.tensor([3, 3, 2, 0])
    accepted = torch.tensor([3, 1, 0, 0])
    tested, acc = round_outcomes(lengths, accepted, 4)
    assert tested.tolist() == [
        [True, True, True, False],  # all verified positions reached
        [True, True, False, False],  # position 3 never tested: position 2 was rejected
        [True, False, False, False],
        [False, False, False, False],
    ]
    assert acc[tested].tolist() == [True, True, True, True, False, False]


def test_estimator_learns_from_verification():
    est = ConfidenceEstimator(block_size=2)
    assert torch.allclose(est.predict(torch.tensor([[0.95, 0.2]])), torch.tensor([[0.8, 0.8]]))
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        peaks = torch.rand(16, 2, generator=g)
        # A draft is accepted iff its distribution was peaked (peak > 0.5).
        accepted = (peaks[:, 0] > 0.5).long() * (1 + (peaks[:, 1] > 0.5).long())
        est.observe(peaks, torch.full((16,), 2), accepted)
    conf = est.predict(torch.tensor([[0.9, 0.9], [0.1, 0.1]]))
    assert conf[0, 0] > 0.9 and conf[1, 0] < 0.1
    assert conf[0, 1] > 0.9 and conf[1, 1] < 0.1
    rates = est.position_rates()
    assert 0.4 < float(rates[0]) < 0.6  # half the first drafts were accepted


def test_features_read_the_distribution_not_the_token():
    probs = torch.softmax(torch.randn(3, 4, 10), dim=-1)
    tokens, lengths = torch.randint(0, 10, (3, 4)), torch.full((3,), 4)
    torch.testing.assert_close(DraftBlock(tokens, lengths, probs).peaks(), probs.amax(-1))
    # a deterministic block (probs None: one-hot at the tokens) peaks at 1 everywhere
    torch.testing.assert_close(DraftBlock(tokens, lengths, None).peaks(), torch.ones(3, 4))
