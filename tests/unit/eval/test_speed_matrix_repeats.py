"""Repeated runs of a speed-matrix cell: seconds and tokens summed, outputs compared (issue 17)."""

from __future__ import annotations

import pytest

from dspark.eval.speed_matrix import _Run


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
