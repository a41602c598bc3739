"""``dspark bench startup``: interleaved fresh processes, medians, ratios to the baselines."""

from __future__ import annotations

import sys

import pytest

from dspark.bench.startup import FLOOR, HEAVY, StartupTimes, commands, table, time_startup


def test_rows_are_ratios_to_the_heavy_imports_and_seconds_over_the_floor():
    result = StartupTimes({FLOOR: 0.1, HEAVY: 2.0, "dspark --help": 0.5}, repeats=3, load_average=0.0)
    assert result.rows()[2] == ("dspark --help", 0.5, pytest.approx(0.25), pytest.approx(0.4))
    assert "dspark --help" in table(result)


def test_every_command_is_timed_in_a_fresh_process():
    quick = {FLOOR: [sys.executable, "-c", "pass"], HEAVY: [sys.executable, "-c", "pass"]}
    result = time_startup(repeats=2, cmds=quick)
    assert set(result.median_s) == {FLOOR, HEAVY} and all(t > 0 for t in result.median_s.values())
    assert list(commands())[:2] == [FLOOR, HEAVY]  # baselines first
