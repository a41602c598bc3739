"""CPU threads for torch: how many, and how the idle ones wait (DESIGN §15.1).

Two defaults make dspark degrade gracefully on a machine it shares with other work:

- **Passive waiting.** OpenMP's default makes a thread that has finished its share of
  a parallel region spin for a while before sleeping. When another process holds one of
  the cores, the spinning threads and the late one fight for it and every operator
  waits for the slowest thread: a 2-thread forward can become many times slower than a
  1-thread one. ``OMP_WAIT_POLICY=PASSIVE`` makes them sleep at once. OpenMP reads the
  variable when torch loads it, so :func:`prefer_passive_waiting` must run before
  ``import torch`` (``dspark/__init__.py`` calls it); a value the user set is kept.
- **Threads from the cores that are free.** Without ``--threads`` (or
  ``OMP_NUM_THREADS``), torch would use every core; dspark uses the cores of its CPU
  affinity minus the 1-minute load average (at least 1), divided among the processes
  of a ``torchrun`` node. The load average lags by up to a minute, so a job that starts
  after dspark still competes with it — passive waiting is what keeps that case cheap.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

WAIT_POLICY = "OMP_WAIT_POLICY"


def prefer_passive_waiting(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless it is set or torch is loaded already; True if set."""
    if WAIT_POLICY in environ or "torch" in sys.modules:
        return False
    environ[WAIT_POLICY] = "PASSIVE"
    return True


def usable_cpus() -> int:
    """Cores this process may run on (its CPU affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average (runnable + uninterruptible tasks), or None where unknown."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def free_cores_threads(cpus: int, load: float | None, processes: int = 1) -> int:
    """Threads per process from the free cores: ``round(cpus − load) // processes``, in ``[1, cpus]``.

    ``load`` None (unknown) counts as an idle machine.
    """
    free = cpus - (load or 0.0)
    per_process = math.floor(free + 0.5) // max(processes, 1)
    return max(1, min(cpus, per_process))


@dataclass(frozen=True, kw_only=True)
class ThreadChoice:
    threads: int
    source: str  # "--threads", "OMP_NUM_THREADS" or "free cores"
    cpus: int
    load: float | None  # 1-minute load average when the choice was made

    def describe(self) -> str:
        load = "unknown" if self.load is None else f"{self.load:.2f}"
        return f"{self.threads} torch threads ({self.source}; {self.cpus} cores, load {load})"


def choose_threads(requested: int | None, environ: MutableMapping[str, str] = os.environ) -> ThreadChoice:
    """``requested`` if given, else ``OMP_NUM_THREADS`` if set, else :func:`free_cores_threads`."""
    cpus, load = usable_cpus(), load_average()
    if requested:
        return ThreadChoice(threads=requested, source="--threads", cpus=cpus, load=load)
    env = environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return ThreadChoice(threads=int(env), source="OMP_NUM_THREADS", cpus=cpus, load=load)
    processes = int(environ.get("LOCAL_WORLD_SIZE", "1") or 1)  # set by torchrun
    return ThreadChoice(
        threads=free_cores_threads(cpus, load, processes), source="free cores", cpus=cpus, load=load
    )


def apply_threads(requested: int | None = None) -> ThreadChoice:
    """Choose (:func:`choose_threads`) and set torch's intra-op thread count; returns the choice."""
    import torch

    choice = choose_threads(requested)
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    log.info("%s, %s=%s", choice.describe(), WAIT_POLICY, os.environ.get(WAIT_POLICY, "unset"))
    return choice
