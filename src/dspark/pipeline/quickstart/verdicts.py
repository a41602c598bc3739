"""What a quickstart report concludes in words: faster or slower, calibration beyond noise,
and the ratios that drafting cannot have produced."""

from __future__ import annotations

from typing import Any

from dspark.calibration.metrics import ece_noise
from dspark.pipeline.quickstart.references import is_reference

# A round costs at least one target forward and emits τ tokens on average, so drafting can
# make decoding at most τ times faster: a measured ratio above τ is timing noise or load.
BEYOND_TAU = "†"
BEYOND_TAU_NOTE = (
    f"{BEYOND_TAU} above τ: a round costs at least one target forward, so drafting cannot make "
    "decoding more than τ times faster; this ratio is timing noise or a change of load between the two runs."
)


def beyond_tau(speedup: float | None, tau: float | None) -> bool:
    """Whether a speedup exceeds what an acceptance length of ``tau`` allows."""
    return speedup is not None and tau is not None and speedup > tau


def speedup_cell(speedup: float | None, tau: float | None) -> str:
    """A table cell: the speedup, flagged when it exceeds τ."""
    return ("–" if speedup is None else f"{speedup:.2f}×") + (BEYOND_TAU if beyond_tau(speedup, tau) else "")


def speed_verdict(means: dict[str, dict[str, float | None]]) -> str:
    """In words: did the drafters this run trained make the target faster or slower?"""
    trained = {m: v["speedup"] for m, v in means.items() if not is_reference(m) and v["speedup"] is not None}
    if not trained:
        return "No drafter trained by this run was timed."
    faster = sorted(m for m, v in trained.items() if v > 1.0)
    best = max(trained, key=trained.get)
    figures = ", ".join(f"{m} {v:.2f}×" for m, v in sorted(trained.items()))
    if not faster:
        return (
            f"**The drafters this run trained made the target slower** than plain decoding "
            f"(mean speedup over math/code/chat: {figures})."
        )
    if len(faster) == len(trained):
        return f"**The drafters this run trained made the target faster** ({figures})."
    return (
        f"**Of the drafters this run trained, only {', '.join(faster)} made the target faster** "
        f"({figures}; best {best})."
    )


def calibration_verdict(calibration: dict[str, Any]) -> str:
    """ "improved", "worse" or "unchanged" mean held-out ECE, judged against :func:`ece_noise`."""
    change = calibration["mean_ece_before"] - calibration["mean_ece_after"]
    noise = ece_noise(calibration["report_rounds"])
    if abs(change) <= noise:
        return f"unchanged within noise (±{100 * noise:.1f} points on {calibration['report_rounds']} rounds)"
    return "improved beyond noise" if change > 0 else "worse beyond noise"
