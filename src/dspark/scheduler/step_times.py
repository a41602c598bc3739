"""Step times as the engine observes them, over the profiled SPS curve (issue 17).

The payoff controller prices verification and drafting in step times. The SPS profile
was measured once, on a machine whose load, context lengths and thermal state were those
of that moment; on a shared CPU the same forward can cost 1.5× more an hour later, and a
profile taken during a burst of other work bends the curve (verifying one extra token
priced at +25 % of a step when it costs +5 %). So the engine reports the seconds of every
pure decode/verification forward it runs, and the cost of a step of ``B`` tokens is

    t̂(B) = t_obs(B)               once B was observed ``min_count`` times (decayed mean)
    t̂(B) = s · t_profile(B)       otherwise, s = decayed mean of t_obs / t_profile

— the profile keeps the curve's shape where nothing was observed, the observations set
its scale and, where the engine actually runs, its shape. Only past forwards are read,
never a draft, so decisions priced with it stay lossless.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dspark.scheduler.profile import SpsTable


@dataclass
class StepTimes:
    """Decayed means of observed forward seconds per step size, over a profile."""

    profile: SpsTable
    memory: float = 0.95  # weight of the past per observation (~20 steps)
    min_count: float = 3.0  # decayed observations of a size before its own mean is used
    sums: dict[int, float] = field(default_factory=dict)  # B -> decayed Σ seconds
    counts: dict[int, float] = field(default_factory=dict)  # B -> decayed number of steps
    scale_sum: float = 0.0  # decayed Σ t_obs / t_profile over every size
    scale_count: float = 0.0

    def observe(self, num_tokens: int, seconds: float) -> None:
        """One forward of ``num_tokens`` decode/verification rows took ``seconds``."""
        if num_tokens < 1 or seconds <= 0:
            return
        m = self.memory
        self.sums[num_tokens] = m * self.sums.get(num_tokens, 0.0) + seconds
        self.counts[num_tokens] = m * self.counts.get(num_tokens, 0.0) + 1.0
        self.scale_sum = m * self.scale_sum + seconds * self.profile(num_tokens)
        self.scale_count = m * self.scale_count + 1.0

    @property
    def scale(self) -> float:
        """Observed over profiled step time (1 before any observation)."""
        return self.scale_sum / self.scale_count if self.scale_count else 1.0

    def seconds(self, num_tokens: int) -> float:
        """``t̂(B)``: the step time to price a forward of ``num_tokens`` rows with."""
        B = max(num_tokens, 1)
        if self.counts.get(B, 0.0) >= self.min_count:
            return self.sums[B] / self.counts[B]
        return self.scale / self.profile(B)

    def verify_costs(self, num_requests: int, K: int) -> tuple[float, ...]:
        """``v(ℓ)``, ℓ = 0..K: seconds per request that verifying ℓ drafts each adds to a
        step of ``num_requests`` requests. Non-decreasing in ℓ: a bigger verification never
        costs less, whatever mix of observed and profiled times the sizes have."""
        R = max(num_requests, 1)
        base = self.seconds(R)
        out, worst = [], 0.0
        for ell in range(K + 1):
            worst = max(worst, (self.seconds(R + R * ell) - base) / R)
            out.append(worst)
        return tuple(out)

    def tokens_per_s(self, num_requests: int) -> float:
        """``ρ``: tokens per second plain decoding makes with ``num_requests`` requests."""
        R = max(num_requests, 1)
        return R / self.seconds(R)
