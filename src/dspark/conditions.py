"""The conditions a figure was measured under: threads, dtype, device, machine load (DESIGN §15.2).

Speed ratios from a shared machine are only as good as its load allowed. Every report
and benchmark records a :class:`RunConditions` — captured with :func:`start` before the
work and closed with :meth:`RunConditions.ended` after it — and prints its
:meth:`~RunConditions.warning` when other work competed for the cores.

The load is the kernel's 1-minute load average: at the start it counts the other work
(ours has not begun), at the end it also counts ours — about one per thread while it
computes — so the competing load is estimated as ``max(start, end − threads)``. Both
lag by up to a minute; the estimate is coarse, and says so.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import asdict, dataclass, replace
from typing import Any

from dspark.threads import WAIT_POLICY, load_average, usable_cpus

# Competing load above the cores our threads leave free by more than this = "busy".
BUSY_MARGIN = 0.5


def competing_load(threads: int, load_start: float | None, load_end: float | None) -> float | None:
    """Estimated load of other work: ``max(start, end − threads)`` (module docstring)."""
    known = [v for v in (load_start, None if load_end is None else load_end - threads) if v is not None]
    return max(0.0, max(known)) if known else None


def machine_busy(cpus: int, threads: int, load_start: float | None, load_end: float | None) -> bool:
    """True when the other work needed more than the cores our ``threads`` left free."""
    other = competing_load(threads, load_start, load_end)
    return other is not None and other > max(cpus - threads, 0) + BUSY_MARGIN


@dataclass(frozen=True, kw_only=True)
class RunConditions:
    threads: int  # torch intra-op threads
    dtype: str
    device: str
    cpus: int  # cores of this process's affinity
    wait_policy: str  # OMP_WAIT_POLICY as torch loaded it ("unset" = OpenMP's default, spinning)
    started: str  # ISO time, seconds
    load_start: float | None  # 1-minute load average
    load_end: float | None = None
    seconds: float | None = None

    def ended(self) -> RunConditions:
        """These conditions with the load and the time at the end of the work."""
        began = datetime.datetime.fromisoformat(self.started)
        now = datetime.datetime.now().astimezone()
        return replace(self, load_end=load_average(), seconds=round((now - began).total_seconds(), 1))

    @property
    def busy(self) -> bool:
        return machine_busy(self.cpus, self.threads, self.load_start, self.load_end)

    def describe(self) -> str:
        """One line: ``2 threads, float32 on cpu (2 cores, OMP_WAIT_POLICY=PASSIVE), 1-min load ...``."""

        def load(v: float | None) -> str:
            return "?" if v is None else f"{v:.2f}"

        end = "" if self.load_end is None else f" → {load(self.load_end)}"
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        return (
            f"{threads}, {self.dtype} on {self.device} ({self.cpus} cores, "
            f"{WAIT_POLICY}={self.wait_policy}), 1-min load average {load(self.load_start)}{end}"
        )

    def warning(self) -> str | None:
        """A warning when the machine was busy enough to distort speed ratios, else None."""
        if not self.busy:
            return None
        other = competing_load(self.threads, self.load_start, self.load_end)
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        return (
            f"the machine was busy: other work had a load of about {other:.1f} on {self.cpus} cores "
            f"while this run used {threads}, so its speeds and speed ratios are distorted "
            "(rerun on an idle machine for figures to compare)"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"busy": self.busy}


def start(*, dtype: Any = "float32", device: Any = "cpu") -> RunConditions:
    """Conditions at the start of a measurement (call :meth:`RunConditions.ended` after it)."""
    import torch

    return RunConditions(
        threads=torch.get_num_threads(),
        dtype=str(dtype).removeprefix("torch."),
        device=str(device),
        cpus=usable_cpus(),
        wait_policy=os.environ.get(WAIT_POLICY, "unset"),
        started=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        load_start=load_average(),
    )


def for_target(target) -> RunConditions:
    """:func:`start` with a target adapter's dtype and device."""
    return start(dtype=target.dtype, device=target.device)


def markdown(conditions: RunConditions | None) -> str:
    """The conditions as a report paragraph: one line, plus the busy warning when there is one."""
    if conditions is None:
        return "Run conditions: not recorded."
    text = f"Run conditions: {conditions.describe()}."
    warning = conditions.warning()
    return text if warning is None else f"{text}\n\n> **Warning:** {warning}."
