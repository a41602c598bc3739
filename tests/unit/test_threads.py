"""Thread defaults: passive OpenMP waiting before torch loads, threads from the free cores."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dspark.threads import choose_threads, free_cores_threads, prefer_passive_waiting


@pytest.mark.parametrize(
    ("cpus", "load", "processes", "threads"),
    [
        (2, 0.05, 1, 2),  # idle 2-core machine: both cores
        (2, 1.0, 1, 1),  # one other job: the free core
        (2, 1.4, 1, 1),
        (2, 3.7, 1, 1),  # overloaded: never below 1
        (16, 3.2, 1, 13),
        (16, 0.0, 4, 4),  # torchrun, 4 processes on the node
        (8, None, 1, 8),  # load unknown: as idle
    ],
)
def test_threads_come_from_the_free_cores(cpus, load, processes, threads):
    assert free_cores_threads(cpus, load, processes) == threads


def test_an_explicit_choice_wins_over_the_free_cores():
    assert choose_threads(3, {}).threads == 3 and choose_threads(3, {}).source == "--threads"
    env = {"OMP_NUM_THREADS": "5"}
    assert choose_threads(None, env).threads == 5 and choose_threads(None, env).source == "OMP_NUM_THREADS"
    assert choose_threads(None, {}).source == "free cores"


def test_passive_waiting_is_set_only_when_unset_and_before_torch():
    import torch  # noqa: F401  (loaded: too late to change OpenMP's policy in this process)

    env: dict[str, str] = {}
    assert not prefer_passive_waiting(env) and env == {}
    assert not prefer_passive_waiting({"OMP_WAIT_POLICY": "ACTIVE"})


def test_importing_dspark_sets_passive_waiting_before_torch_loads():
    code = "import os, dspark, torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "PASSIVE"
    env["OMP_WAIT_POLICY"] = "ACTIVE"  # the user's choice is kept
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ACTIVE"
