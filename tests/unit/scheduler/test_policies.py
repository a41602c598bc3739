"""Verification policies on hand-made confidences and SPS tables (DESIGN §9, paper Algorithm 1)."""

from __future__ import annotations

import pytest
import torch

from dspark.scheduler.policies import (
    Policy,
    SpsTable,
    fixed_lengths,
    global_search,
    parse_policy,
    prefix_async_lengths,
    prefix_lengths,
    schedule,
    survival,
    threshold_lengths,
)


def algorithm1(conf: list[list[float]], caps: list[int], sps, *, early_stop: bool = True) -> list[int]:
    """Paper Algorithm 1, transcribed line by line (the reference for the vectorised code)."""
    R = len(conf)
    a = {}
    for r in range(R):
        prod = 1.0
        for j in range(1, caps[r] + 1):
            prod *= conf[r][j - 1]
            a[(r, j)] = prod
    E = sorted((k for k, v in a.items() if v > 0), key=lambda rj: (-a[rj], rj[1], rj[0]))
    ell, B, tau = [0] * R, R, float(R)
    best, best_ell = R * sps(R), [0] * R
    for r, j in E:
        ell[r], B, tau = j, B + 1, tau + a[(r, j)]
        theta = tau * sps(B)
        if theta > best:
            best, best_ell = theta, list(ell)
        elif early_stop:
            break
    return best_ell


# A cliff at B = 5, flat after it: early stopping halts at the cliff, a global search crosses it.
JAGGED = SpsTable.from_dict({2: 1.0, 3: 0.95, 4: 0.9, 5: 0.7, 6: 0.68, 7: 0.66, 8: 0.65})
CONF = torch.tensor([[0.9, 0.8, 0.5], [0.6, 0.9, 0.9]])  # a = [[.9, .72, .36], [.6, .54, .486]]


def test_parse_policy():
    assert parse_policy("fixed") == Policy(kind="fixed")
    assert parse_policy("fixed:1") == Policy(kind="fixed", k=1)
    assert parse_policy("threshold:0.7") == Policy(kind="threshold", threshold=0.7)
    assert parse_policy("prefix").kind == "prefix" and parse_policy("prefix-async").kind == "prefix-async"
    assert [str(parse_policy(s)) for s in ("fixed:3", "threshold:0.5", "prefix-async")] == [
        "fixed:3",
        "threshold:0.5",
        "prefix-async",
    ]
    for bad in ("fixed:x", "threshold", "threshold:1.5", "prefix:3", "greedy", "fixed:-1"):
        with pytest.raises(ValueError):
            parse_policy(bad)


def test_fixed_and_threshold():
    caps = torch.tensor([3, 1])
    assert fixed_lengths(caps).tolist() == [3, 1]
    assert fixed_lengths(caps, 2).tolist() == [2, 1]
    # Cut at the first c_k < t, even if later ones are higher again.
    assert threshold_lengths(CONF, torch.tensor([3, 3]), 0.7).tolist() == [2, 0]
    assert threshold_lengths(CONF, torch.tensor([1, 3]), 0.55).tolist() == [1, 3]
    assert schedule(parse_policy("fixed:1"), torch.tensor([0, 4])).tolist() == [0, 1]


def test_algorithm1_by_hand_on_a_jagged_table():
    caps = torch.tensor([3, 3])
    # Θ0 = 2.0; +(0,1): 2.9·0.95 = 2.755; +(0,2): 3.62·0.9 = 3.258; +(1,1): 4.22·0.7 = 2.954 → stop.
    assert prefix_lengths(CONF, caps, JAGGED).tolist() == [2, 0]
    # Without the break: +(1,2) 3.237, +(1,3) 3.462, +(0,3) 5.606·0.65 = 3.644, the global best.
    assert global_search(CONF, caps, JAGGED).tolist() == [3, 3]
    assert algorithm1(CONF.tolist(), [3, 3], JAGGED) == [2, 0]
    assert algorithm1(CONF.tolist(), [3, 3], JAGGED, early_stop=False) == [3, 3]


def test_algorithm1_extremes():
    conf = torch.full((3, 4), 0.9)
    caps = torch.tensor([4, 2, 0])
    assert prefix_lengths(conf, caps, SpsTable.flat()).tolist() == [4, 2, 0]  # free tokens: verify all
    linear = SpsTable.from_dict({b: 1.0 / b for b in range(1, 20)})  # no batching gain: verify none
    assert prefix_lengths(conf, caps, linear).tolist() == [0, 0, 0]
    # c = 1 everywhere: ties must come in prefix order.
    assert prefix_lengths(torch.ones(2, 3), torch.tensor([3, 3]), SpsTable.flat()).tolist() == [3, 3]
    assert prefix_lengths(torch.zeros(2, 3), torch.tensor([3, 3]), SpsTable.flat()).tolist() == [0, 0]


@pytest.mark.parametrize("seed", range(20))
def test_vectorised_equals_transcription(seed):
    g = torch.Generator().manual_seed(seed)
    R, K = int(torch.randint(1, 9, (), generator=g)), int(torch.randint(1, 8, (), generator=g))
    conf = torch.rand(R, K, generator=g) ** 0.3
    conf[torch.rand(R, K, generator=g) < 0.1] = 0.0
    caps = torch.randint(0, K + 1, (R,), generator=g)
    steps = torch.rand(R * (K + 1) + 1, generator=g) * 0.3  # random jagged increments of step time
    sps = SpsTable.from_dict({b: 1.0 / (1 + float(steps[:b].sum())) for b in range(1, R * (K + 1) + 1)})
    base = int(torch.randint(0, 3, (), generator=g))
    if base == 0:  # the transcription has no prefill tokens
        assert prefix_lengths(conf, caps, sps).tolist() == algorithm1(conf.tolist(), caps.tolist(), sps)
        assert global_search(conf, caps, sps).tolist() == algorithm1(
            conf.tolist(), caps.tolist(), sps, early_stop=False
        )
    lengths = prefix_lengths(conf, caps, sps, base_tokens=base)
    assert bool((lengths <= caps).all()) and bool((lengths >= 0).all())


def test_lengths_shrink_as_load_grows():
    """On a saturating curve (throughput B·SPS(B) → 16), each request verifies less as R grows."""
    sps = SpsTable.from_dict({b: 1.0 / (1.0 + b / 16) for b in range(1, 600)})
    per_request = torch.tensor([0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6])
    means = []
    for R in (1, 2, 4, 8, 16, 32, 64):
        conf = per_request.expand(R, -1)
        means.append(float(prefix_lengths(conf, torch.full((R,), 7), sps).double().mean()))
    assert all(a >= b for a, b in zip(means, means[1:])), means
    assert means[0] >= 5 and means[-1] <= 1, means


def test_prefix_async_budget_from_stale_confidences():
    caps = torch.tensor([3, 3])
    stale = torch.tensor([[0.9, 0.9, 0.9], [0.9, 0.9, 0.9]])
    budget = int(global_search(stale, caps, JAGGED).sum())
    assert budget == 6
    # Current confidences rank request 1 first; the budget comes from the stale ones only.
    current = torch.tensor([[0.5, 0.5, 0.5], [0.95, 0.95, 0.2]])
    assert prefix_async_lengths(current, caps, stale, caps, JAGGED).tolist() == [3, 3]
    low = torch.tensor([[0.6, 0.1, 0.1], [0.6, 0.1, 0.1]])  # stale says: verify 2 tokens in all
    assert int(global_search(low, caps, JAGGED).sum()) == 2
    # top-2 of the current ranking: (1,1) 0.95, (1,2) 0.9025
    assert prefix_async_lengths(current, caps, low, caps, JAGGED).tolist() == [0, 2]


def test_survival_is_the_cumulative_product():
    torch.testing.assert_close(survival(CONF), torch.tensor([[0.9, 0.72, 0.36], [0.6, 0.54, 0.486]]).double())
