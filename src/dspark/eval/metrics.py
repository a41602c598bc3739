"""Acceptance metrics over round logs: the definitions of DESIGN §2, each in one place.

A round (:class:`dspark.protocols.RoundLog`) proposed ``proposed`` drafts, of which the
first ``accepted`` survived verification; the target then adds one token of its own
(the recovered token at the first rejection, or the bonus token after a fully accepted
block). With k = 1..K (K the block size γ):

- **τ** (acceptance length) = mean over rounds of ``accepted + 1`` — the recovered or
  bonus token always counts, so 1 ≤ τ ≤ γ+1;
- **tokens-per-round histogram**: how many rounds emitted 1, 2, ..., γ+1 tokens
  (``accepted + 1``, as τ counts them);
- **prefix survival at k** = #rounds with ≥ k accepted / #rounds that proposed ≥ k;
- **conditional acceptance at k** (paper Fig. 2) = #rounds with ≥ k accepted /
  #rounds with ≥ k−1 accepted and ≥ k proposed — draft k judged only where drafts
  1..k−1 survived, so an early rejection does not count against it;
- **verify rate** = Σ accepted / Σ proposed: the share of the draft tokens the target
  verified that it accepted (the rest was wasted verification work);
- **verified per round** = mean of ``proposed`` (the verification budget per round).

A ratio with an empty denominator is ``None`` (no evidence), never 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dspark.protocols import acceptance_length


class Round(Protocol):
    """What the metrics read of a round (:class:`dspark.protocols.RoundLog` has it)."""

    proposed: int
    accepted: int


def tau(rounds: Sequence[Round]) -> float:
    """Acceptance length τ: mean ``accepted + 1`` over rounds (0.0 for no rounds)."""
    return acceptance_length(sum(r.accepted for r in rounds), len(rounds))


def tokens_per_round_histogram(rounds: Sequence[Round], block_size: int) -> list[int]:
    """``hist[i]`` = rounds that emitted ``i + 1`` tokens, for i = 0..γ (length γ+1)."""
    hist = [0] * (block_size + 1)
    for r in rounds:
        if r.accepted > block_size:
            raise ValueError(f"a round accepted {r.accepted} drafts with block size {block_size}")
        hist[r.accepted] += 1
    return hist


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def prefix_survival(rounds: Sequence[Round], block_size: int) -> list[float | None]:
    """``[P(first k accepted) for k = 1..γ]``: #(accepted ≥ k) / #(proposed ≥ k)."""
    return [
        _ratio(
            sum(1 for r in rounds if r.proposed >= k and r.accepted >= k),
            sum(1 for r in rounds if r.proposed >= k),
        )
        for k in range(1, block_size + 1)
    ]


def conditional_acceptance(rounds: Sequence[Round], block_size: int) -> list[float | None]:
    """``[P(draft k accepted | drafts 1..k−1 accepted) for k = 1..γ]`` (paper Fig. 2)."""
    out = []
    for k in range(1, block_size + 1):
        reached = [r for r in rounds if r.proposed >= k and r.accepted >= k - 1]
        out.append(_ratio(sum(1 for r in reached if r.accepted >= k), len(reached)))
    return out


def verify_rate(rounds: Sequence[Round]) -> float | None:
    """Σ accepted / Σ proposed: the share of verified drafts that the target accepted."""
    return _ratio(sum(r.accepted for r in rounds), sum(r.proposed for r in rounds))


def verified_per_round(rounds: Sequence[Round]) -> float:
    """Mean drafts verified per round (0.0 for no rounds)."""
    return sum(r.proposed for r in rounds) / len(rounds) if rounds else 0.0


@dataclass(frozen=True)
class AcceptanceStats:
    """Every acceptance figure of a set of rounds (module docstring); lists are per position k."""

    num_rounds: int
    tau: float
    histogram: list[int]  # [γ+1]: rounds emitting 1..γ+1 tokens
    prefix_survival: list[float | None]  # [γ]
    conditional_acceptance: list[float | None]  # [γ]
    verify_rate: float | None
    verified_per_round: float


def acceptance_stats(rounds: Sequence[Round], block_size: int) -> AcceptanceStats:
    """All of the above for ``rounds`` drafted with block size γ = ``block_size``."""
    return AcceptanceStats(
        num_rounds=len(rounds),
        tau=tau(rounds),
        histogram=tokens_per_round_histogram(rounds, block_size),
        prefix_survival=prefix_survival(rounds, block_size),
        conditional_acceptance=conditional_acceptance(rounds, block_size),
        verify_rate=verify_rate(rounds),
        verified_per_round=verified_per_round(rounds),
    )


def mean_defined(values: Sequence[float | None]) -> float | None:
    """Mean of the values that are not ``None`` (``None`` if there are none)."""
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def macro_average(curves: Sequence[Sequence[float | None]]) -> list[float | None]:
    """Position-wise mean of several per-position curves (e.g. one per benchmark of a domain).

    Each benchmark weighs the same whatever its number of rounds (a macro average, as
    the paper averages benchmarks within a domain); ``None`` entries are left out.
    """
    length = max((len(c) for c in curves), default=0)
    return [mean_defined([c[k] for c in curves if k < len(c)]) for k in range(length)]
