"""The SPS table: O(1) lookup, interpolation in step time, persistence, measurement (DESIGN §9)."""

from __future__ import annotations

import time

import pytest
import torch

from dspark.scheduler import SpsTable, default_sizes, measure_sps


def test_lookup_interpolates_step_time():
    table = SpsTable.from_dict({1: 10.0, 5: 5.0})  # step time 0.1 s at B=1, 0.2 s at B=5
    assert table(1) == pytest.approx(10.0) and table(5) == pytest.approx(5.0)
    assert table(3) == pytest.approx(1 / 0.15)  # halfway in time, not in SPS
    assert table(10) == pytest.approx(2.5)  # past the table: time grows linearly in B
    B = torch.tensor([0, 1, 3, 5, 10])
    torch.testing.assert_close(table.lookup(B), torch.tensor([10.0, 10.0, 1 / 0.15, 5.0, 2.5]).double())
    assert SpsTable.flat(2.0)(1000) == 2.0


def test_validation_and_roundtrip(tmp_path):
    with pytest.raises(AssertionError):
        SpsTable((2, 1), (1.0, 1.0))
    with pytest.raises(AssertionError):
        SpsTable((1, 2), (1.0, 0.0))
    table = SpsTable.from_dict({1: 3.0, 4: 2.0, 9: 1.0}, meta={"target": "x"})
    table.save(tmp_path / "sps.json")
    loaded = SpsTable.load(tmp_path / "sps.json")
    assert loaded == table and loaded.meta == {"target": "x"}
    assert [loaded(b) for b in range(1, 12)] == [table(b) for b in range(1, 12)]


def test_default_sizes_cover_every_small_batch():
    sizes = default_sizes(256)
    assert sizes[:16] == list(range(1, 17)) and sizes[-1] == 256
    assert all(b > a for a, b in zip(sizes, sizes[1:])) and len(sizes) < 50
    assert default_sizes(5) == [1, 2, 3, 4, 5]


def test_measure_sps_times_the_step():
    def step(b: int) -> None:
        time.sleep(0.002 * b)

    table = measure_sps(step, [1, 4], repeats=2, warmup=0, meta={"k": 1})
    assert table.tokens == (1, 4) and table.meta == {"k": 1}
    assert table(1) > 2 * table(4)
    assert 40 < table(4) < 126  # 8 ms per step at least (sleep only overshoots, more under load)


def test_non_decreasing_fit_removes_dips_keeps_cliffs():
    from dspark.scheduler.profile import non_decreasing

    assert non_decreasing([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert non_decreasing([1.0, 1.0, 5.0, 5.0]) == [1.0, 1.0, 5.0, 5.0]  # a cliff stays
    assert non_decreasing([3.0, 2.0, 1.0]) == [2.0, 2.0, 2.0]


def test_measure_sps_times_steps_on_the_clock_it_is_given():
    """A step of B tokens advances a fake clock by B/100 s (and sleeps: wall time it does not
    count): the table is exactly that clock's, whatever the wall clock says."""
    now = [0.0]

    def step(b: int) -> None:
        time.sleep(0.001)
        now[0] += b / 100

    table = measure_sps(step, [1, 2, 8], repeats=2, clock=lambda: now[0])
    assert table.steps_per_s == pytest.approx((100.0, 50.0, 12.5))


def test_a_one_thread_cpu_target_is_profiled_on_its_threads_cpu_clock(tiny_qwen3):
    from dspark.engine.profile import profile_clock, profile_key
    from dspark.targets import TargetAdapter

    target = TargetAdapter(tiny_qwen3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert profile_clock(target) == ("thread", time.thread_time)
        key = profile_key(target, num_slots=2, block_size=3, context=8)
        torch.set_num_threads(2)
        assert profile_clock(target) == ("wall", time.perf_counter)
        assert profile_key(target, num_slots=2, block_size=3, context=8) != key
    finally:
        torch.set_num_threads(threads)
