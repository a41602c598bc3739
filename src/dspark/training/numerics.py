"""Floating-point settings of a training step.

The loss's ``[.., V]`` probabilities are full of subnormal floats (< 1.2e-38); on x86 each
one costs a microcode assist, which doubled a CPU training step on the tiny target
(BENCHMARKS.md, "Training throughput"). Flushing them to zero inside the step removes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def flushing_denormals(enabled: bool) -> Iterator[None]:
    """CPU flush-to-zero / denormals-are-zero inside the block (a process-wide flag, reset after).

    Values below ~1.2e-38 become 0: far below the losses' float noise, and nothing here
    reads them (inference outside the block keeps the default IEEE behaviour).
    """
    if not enabled or not torch.set_flush_denormal(True):  # False: this CPU cannot
        yield
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
