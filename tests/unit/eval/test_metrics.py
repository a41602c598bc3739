"""The acceptance metrics of DESIGN §2 against hand-counted round logs."""

from __future__ import annotations

import math
import random

import pytest

from dspark.eval.metrics import (
    acceptance_stats,
    conditional_acceptance,
    macro_average,
    prefix_survival,
    tau,
    tokens_per_round_histogram,
    verified_per_round,
    verify_rate,
)
from dspark.protocols import GenerationResult, RoundLog

# γ = 3. Emitted counts do not matter to the metrics (they only differ when EOS cuts).
ROUNDS = [
    RoundLog(proposed=3, accepted=3, emitted=4),  # fully accepted + bonus
    RoundLog(proposed=3, accepted=1, emitted=2),
    RoundLog(proposed=3, accepted=0, emitted=1),
    RoundLog(proposed=2, accepted=2, emitted=3),  # budget-limited round near max_tokens
    RoundLog(proposed=0, accepted=0, emitted=1),  # last token: no drafts
]


def test_tau_counts_the_recovered_or_bonus_token():
    assert tau(ROUNDS) == pytest.approx((4 + 2 + 1 + 3 + 1) / 5)
    assert tau(ROUNDS) == GenerationResult([], "", "stop", rounds=ROUNDS).tau
    assert tau([]) == 0.0


def test_histogram_of_tokens_per_round():
    assert tokens_per_round_histogram(ROUNDS, 3) == [2, 1, 1, 1]  # 1, 2, 3, 4 tokens
    with pytest.raises(ValueError):
        tokens_per_round_histogram(ROUNDS, 2)


def test_prefix_survival_divides_by_rounds_that_proposed_k():
    # k=1: 3 of the 4 rounds with drafts; k=2: rounds 1 and 4 of 4; k=3: round 1 of the 3 that proposed 3.
    assert prefix_survival(ROUNDS, 3) == pytest.approx([3 / 4, 2 / 4, 1 / 3])


def test_conditional_acceptance_divides_by_rounds_that_reached_k():
    # k=2: reached by rounds 1, 2, 4 (>= 1 accepted, >= 2 proposed), accepted by 1 and 4.
    # k=3: reached by round 1 only (round 4 proposed 2), accepted.
    assert conditional_acceptance(ROUNDS, 3) == pytest.approx([3 / 4, 2 / 3, 1.0])


def test_verify_rate_and_budget():
    assert verify_rate(ROUNDS) == pytest.approx(6 / 11)
    assert verified_per_round(ROUNDS) == pytest.approx(11 / 5)


def test_no_evidence_is_none_not_zero():
    only_short = [RoundLog(proposed=1, accepted=0, emitted=1)]
    assert prefix_survival(only_short, 2) == [0.0, None]
    assert conditional_acceptance(only_short, 2) == [0.0, None]
    assert verify_rate([RoundLog(0, 0, 1)]) is None


def test_chain_rule_links_the_two_curves():
    """With every round proposing γ drafts, Π_{i<=k} conditional_i == survival_k."""
    rng = random.Random(0)
    rounds = [RoundLog(proposed=5, accepted=min(5, int(rng.expovariate(0.4))), emitted=0) for _ in range(400)]
    cond, surv = conditional_acceptance(rounds, 5), prefix_survival(rounds, 5)
    for k in range(5):
        assert math.prod(cond[: k + 1]) == pytest.approx(surv[k])


def test_acceptance_stats_and_macro_average():
    stats = acceptance_stats(ROUNDS, 3)
    assert stats.num_rounds == 5 and stats.histogram == [2, 1, 1, 1]
    assert stats.conditional_acceptance == conditional_acceptance(ROUNDS, 3)
    # Each curve weighs the same whatever its length; None entries are skipped.
    assert macro_average([[1.0, None, 0.5], [0.0, 0.4]]) == pytest.approx([0.5, 0.4, 0.5])
