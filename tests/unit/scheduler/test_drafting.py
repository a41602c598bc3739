"""Cost-aware drafting: draft only when the expected accepted tokens repay the time spent."""

import torch

from dspark.scheduler import SpsTable, drafting_pays, marginal_token_s


def test_cheap_drafter_with_good_acceptance_drafts():
    pays = drafting_pays(
        torch.tensor([0.8]), torch.full((6,), 0.8), draft_s=0.001, token_s=0.0001, tokens_per_s=100.0
    )
    assert pays.tolist() == [True]  # gain 0.8 > 100 * 0.0011 = 0.11


def test_expensive_drafting_at_high_load_is_skipped():
    # 64 requests at 64 tokens / 0.1 s: 640 tokens/s; drafting 0.7 ms + 1.5 ms per verified token
    pays = drafting_pays(
        torch.tensor([0.45, 0.9]), torch.full((6,), 0.3), draft_s=0.0007, token_s=0.0015, tokens_per_s=640.0
    )
    # cost of the best length ℓ=1: 640 * 0.0022 = 1.41 tokens > any gain below 1.0 + ...
    assert pays.tolist() == [False, False]


def test_decision_is_per_request_and_uses_the_whole_chain():
    later = torch.tensor([0.9, 0.9, 0.9])
    first = torch.tensor([0.05, 0.6])
    # ρ(d + ℓm) = 10 * (0.05 + 0.001 ℓ) ≈ 0.51..0.54; gains: 0.05.. vs 0.6, 1.14, 1.63, 2.07
    pays = drafting_pays(first, later, draft_s=0.05, token_s=0.001, tokens_per_s=10.0)
    assert pays.tolist() == [False, True]
    # with no later acceptance, a 0.6 first-draft rate alone still beats 0.51
    assert drafting_pays(first, torch.zeros(3), draft_s=0.05, token_s=0.001, tokens_per_s=10.0).tolist() == [
        False,
        True,
    ]


def test_marginal_token_time_from_the_sps_table():
    # step time 10 ms + 1 ms per token beyond 1: SPS(B) = 1 / (0.009 + 0.001 B)
    sizes = [1, 2, 4, 8, 16, 32]
    table = SpsTable(tokens=sizes, steps_per_s=[1.0 / (0.009 + 0.001 * b) for b in sizes])
    assert abs(marginal_token_s(table, 8, 8) - 0.001) < 1e-9
    flat = SpsTable(tokens=sizes, steps_per_s=[100.0] * len(sizes))
    assert marginal_token_s(flat, 4, 4) == 0.0


def test_unprofitable_requests_are_probed_less_often():
    from dspark.scheduler import FirstAcceptPredictor

    good = FirstAcceptPredictor(estimate=0.9)
    assert [good.should_draft(0.1, 8, pays=False, probe_unprofitable=32) for _ in range(64)].count(True) == 2
    # profitable again: drafts every round (the early-exit threshold is met)
    assert all(good.should_draft(0.1, 8, pays=True, probe_unprofitable=32) for _ in range(5))
    # without a longer interval, unprofitable requests are probed every probe_every rounds
    other = FirstAcceptPredictor(estimate=0.9)
    assert [other.should_draft(0.1, 8, pays=False) for _ in range(64)].count(True) == 8
