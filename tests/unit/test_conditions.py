"""Run conditions: the competing-load estimate and when a report warns that the machine was busy."""

from __future__ import annotations

import dataclasses

import pytest

from dspark import conditions
from dspark.conditions import RunConditions, competing_load, machine_busy


@pytest.mark.parametrize(
    ("cpus", "threads", "start", "end", "busy"),
    [
        (2, 1, 0.1, 1.1, False),  # alone, one thread: the end load is ours
        (2, 2, 0.1, 2.1, False),  # alone, two threads
        (2, 1, 1.0, 2.0, False),  # one other job on the other core: no contention with 1 thread
        (2, 2, 1.0, 3.0, True),  # ... but with 2 threads we fought it for a core
        (2, 1, 2.0, 3.0, True),  # two other jobs: even 1 thread shares a core
        (2, 2, 0.1, 3.2, True),  # a job started during the run (seen only at the end)
        (2, 2, None, None, False),  # unknown load: no claim either way
    ],
)
def test_machine_busy(cpus, threads, start, end, busy):
    assert machine_busy(cpus, threads, start, end) is busy


def test_competing_load_discounts_our_own_threads_at_the_end():
    assert competing_load(2, 0.5, 3.0) == pytest.approx(1.0)
    assert competing_load(2, 1.5, 2.5) == pytest.approx(1.5)
    assert competing_load(2, None, 1.0) == 0.0


def test_conditions_are_recorded_and_warn_when_busy():
    import torch

    c = conditions.start(dtype=torch.float32, device="cpu").ended()
    assert c.threads == torch.get_num_threads() and c.dtype == "float32" and c.device == "cpu"
    assert c.load_start is not None and c.load_end is not None and c.seconds >= 0
    assert set(c.as_dict()) >= {"threads", "dtype", "load_start", "load_end", "busy", "wait_policy"}
    busy = dataclasses.replace(c, cpus=2, threads=2, load_start=1.5, load_end=3.5)
    idle = dataclasses.replace(c, cpus=2, threads=2, load_start=0.0, load_end=2.0)
    assert "the machine was busy" in busy.warning() and idle.warning() is None
    assert "> **Warning:**" in conditions.markdown(busy) and "Warning" not in conditions.markdown(idle)
    assert "2 threads, float32 on cpu" in conditions.markdown(idle)
    assert isinstance(busy, RunConditions)
