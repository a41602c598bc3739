"""Repeated runs of a speed-matrix cell: seconds and tokens summed, outputs compared (issue 17)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dspark.bench.speed_matrix import _Run


def run(seconds: float, tokens: int, outputs) -> _Run:
    return _Run(
        seconds=seconds, wall_s=2 * seconds, tokens=tokens, outputs=outputs, tau=2.0, drafted_share=0.5
    )


def test_repeats_sum_seconds_and_tokens_so_the_ratio_is_over_all_of_them():
    total = run(1.0, 100, [[1, 2]]) + run(3.0, 100, [[1, 2]])
    assert (total.seconds, total.wall_s, total.tokens) == (4.0, 8.0, 200)
    assert total.tokens / total.seconds == pytest.approx(50.0)  # not the mean of 100 and 33
    assert total.outputs == [[1, 2]]


def test_repeats_that_disagree_have_no_outputs_to_call_identical():
    assert (run(1.0, 10, [[1, 2]]) + run(1.0, 10, [[1, 3]])).outputs is None


def test_each_repeat_ends_with_plain_decoding_again_as_an_a_a_control(monkeypatch):
    """The baseline is plain decoding at both ends of each repeat; how far the second run's speed
    is from the first's is every cell's ``noise``, and a cell below the floor by more than that
    is reported apart."""
    from dspark.bench import speed_matrix as sm
    from dspark.bench.speed_matrix import Cell, goals, speed_matrix

    order = []
    speeds = iter([100.0, 150.0, 120.0])  # plain, payoff, control: tokens per CPU-second

    def decode(engine, prompts, max_tokens):
        order.append("plain" if engine.drafter is None else "payoff")
        return run(10 / next(speeds), 10, [[1, 2]])

    monkeypatch.setattr(sm, "_decode", decode)
    monkeypatch.setattr(sm, "Engine", lambda target, drafter, config: type("E", (), {"drafter": drafter}))
    target = SimpleNamespace(max_context=512)
    (cell,) = speed_matrix(target, {"set": [[1, 2, 3]]}, {"d": object()}, [1], static=())
    assert order == ["plain", "payoff", "plain"]
    assert cell.noise == pytest.approx(0.2)  # 120 against 100
    assert cell.speedup == pytest.approx(150 / (20 / (10 / 100 + 10 / 120)))  # over both plain runs
    assert cell.identical

    def cell_at(drafter, speedup, noise):
        return Cell("s", drafter, 1, "payoff", 1.0, speedup, speedup, 1.0, 0.0, True, noise=noise)

    check = goals([cell_at("a", 0.90, 0.10), cell_at("b", 0.90, 0.02), cell_at("c", 0.99, 0.0)])
    assert len(check["below_floor"]) == 2 and len(check["below_floor_beyond_noise"]) == 1
    assert check["max_noise"] == pytest.approx(0.10)


def test_a_cell_reports_how_far_its_own_repeats_scatter(monkeypatch):
    """``spread``: the standard error of the method's speedup over the repeats, each repeat against
    its own plain and control runs; a cell below the floor by more than two of them is counted."""
    from dspark.bench import speed_matrix as sm
    from dspark.bench.speed_matrix import Cell, goals, speed_matrix

    # plain, payoff, control per repeat: payoff 0.9x then 1.1x of its repeat's plain pair
    speeds = iter([100.0, 90.0, 100.0, 100.0, 110.0, 100.0])

    def decode(engine, prompts, max_tokens):
        return run(10 / next(speeds), 10, [[1, 2]])

    monkeypatch.setattr(sm, "_decode", decode)
    monkeypatch.setattr(sm, "Engine", lambda target, drafter, config: type("E", (), {"drafter": drafter}))
    target = SimpleNamespace(max_context=512)
    (cell,) = speed_matrix(target, {"set": [[1, 2, 3]]}, {"d": object()}, [1], static=(), repeats=2)
    assert cell.noise == pytest.approx(0.0)  # plain agreed with itself
    assert cell.spread == pytest.approx(0.1)  # ratios 0.9 and 1.1: sd 0.141, over sqrt(2)

    def cell_at(drafter, speedup, spread):
        return Cell("s", drafter, 1, "payoff", 1.0, speedup, speedup, 1.0, 0.0, True, spread=spread)

    check = goals([cell_at("a", 0.90, 0.05), cell_at("b", 0.90, 0.02), cell_at("c", 0.99, 0.0)])
    assert check["below_floor_beyond_spread"] == [("s", "b", 1)]


def test_a_cell_below_the_floor_within_its_scatter_says_how_many_repeats_would_decide_it():
    """A cell 0.02 below the floor with an SE of 0.02 over 4 repeats (one repeat's sd 0.04) is
    undecided; two standard errors shrink to the gap at (2 · 0.04 / 0.02)² = 16 repeats. A cell
    beyond two standard errors is decided, and a cell above the floor is not reported."""
    from dspark.bench.speed_matrix import Cell, goals, repeats_to_decide

    def cell_at(drafter, speedup, spread, repeats):
        return Cell(
            "s", drafter, 1, "payoff", 1.0, speedup, speedup, 1.0, 0.0, True, spread=spread, repeats=repeats
        )

    near, far, above = cell_at("a", 0.95, 0.02, 4), cell_at("b", 0.90, 0.02, 4), cell_at("c", 0.99, 0.02, 4)
    assert repeats_to_decide(near, 0.97) == 16
    assert repeats_to_decide(cell_at("d", 0.95, 0.0, 1), 0.97) is None  # one repeat: no scatter known
    check = goals([near, far, above])
    assert check["below_floor_beyond_spread"] == [("s", "b", 1)]
    assert check["below_floor_undecided"] == [{"cell": ("s", "a", 1), "repeats_to_decide": 16}]
