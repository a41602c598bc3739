"""Every registered policy is spelled, parsed and scheduled through its registry row, and
prefix-async's stale history never includes the current step."""

from __future__ import annotations

import pytest
import torch

from dspark.scheduler import POLICIES, SpsTable, parse_policy, schedule, stale_history

SPECS = {"fixed": "fixed:2", "threshold": "threshold:0.4"}  # one spelled with its argument each


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_registered_policy_schedules_within_its_caps(name):
    policy = parse_policy(SPECS.get(name, name))
    assert policy.rule is POLICIES[name] and str(parse_policy(str(policy))) == str(policy)
    g = torch.Generator().manual_seed(0)
    R, K = 6, 5
    conf = torch.rand(R, K, generator=g)
    caps = torch.tensor([0, 1, 5, 3, 5, 2])
    sps = SpsTable.from_dict({b: 1.0 / (1.0 + b / 10) for b in range(1, 64)})
    lengths = schedule(
        policy, caps, conf, sps=sps, stale_confidences=conf.roll(1, 0), stale_caps=torch.full((R,), K)
    )
    assert lengths.shape == (R,) and bool(((lengths >= 0) & (lengths <= caps)).all())
    assert not POLICIES[name].reads_history or POLICIES[name].needs_confidences


def test_stale_history_takes_the_newest_row_old_enough():
    prior = torch.full((6,), 0.5, dtype=torch.float64)
    rows = {t: torch.full((4,), float(t) / 10, dtype=torch.float64) for t in range(4)}
    history = [(t, rows[t]) for t in range(4)]  # recorded at steps 0..3
    stale = stale_history([history, []], step=3, lag=2, prior=prior, K=6)  # [2, 6]
    assert stale[0, :4].tolist() == rows[1].tolist()  # newest at <= 3 - 2, never step 2 or 3
    assert stale[0, 4:].tolist() == [0.5, 0.5]  # positions the old round did not have: the prior
    assert stale[1].tolist() == [0.5] * 6  # a request newer than the lag: the prior
    assert stale_history([history], step=3, lag=2, prior=prior, K=2)[0].tolist() == rows[1][:2].tolist()


def test_an_unknown_policy_names_the_registered_ones():
    with pytest.raises(ValueError, match="choose from fixed, threshold, prefix, prefix-async"):
        parse_policy("greedy")
