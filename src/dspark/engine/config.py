"""Configuration and counters of the engine (DESIGN §10)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dspark.protocols import acceptance_length
from dspark.scheduler import parse_policy

# Slots are preallocated at full length: a model's whole context (40k tokens for Qwen3)
# times 32 slots would not fit anywhere, so the default is modest; raise it per engine.
DEFAULT_MAX_SEQ_LEN = 4096


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Shape and policies of an :class:`Engine`."""

    block_size: int = 7  # γ: most drafts per request per step
    policy: str = "prefix"  # fixed | fixed:k | threshold:t | prefix | prefix-async (DESIGN §9)
    max_batch: int = 32  # KV slots = requests decoded at once; more wait in the queue
    max_seq_len: int | None = None  # tokens per slot (prompt + answer); None = min(target's context, 4096)
    prefill_chunk: int = 256  # prompt tokens prefilled per step, over all prefilling requests
    # The speculation controller (scheduler/controller.py): per request and round, draft only
    # when the predicted accepted tokens repay drafting and verification at this batch, with
    # the proposer that pays most (choose_proposer: the model drafter or prompt lookup);
    # off, every request drafts every round with the drafter
    payoff: bool = True
    choose_proposer: bool = True
    # fixed drafting seconds per request by proposer instead of measured ones, and steps priced
    # by the SPS table alone (a timing for tests)
    draft_costs: tuple[tuple[str, float], ...] | None = None
    sps_path: Path | None = None  # SPS profile to load or create; None = the per-target cache file

    def __post_init__(self) -> None:
        parse_policy(self.policy)  # fail at construction on a bad spec
        if self.block_size < 0 or self.max_batch < 1 or self.prefill_chunk < 1:
            raise ValueError(f"bad engine config {self}")


@dataclass
class EngineStats:
    """Cumulative counters and timings (seconds) of an engine's steps."""

    steps: int = 0
    rounds: int = 0  # decode rounds over all requests
    drafted: int = 0  # draft tokens proposed
    verified: int = 0  # draft tokens sent to verification
    accepted: int = 0
    emitted: int = 0
    prefill_tokens: int = 0
    step_s: float = 0.0
    draft_s: float = 0.0  # drafter.propose
    update_s: float = 0.0  # drafter.update: absorbing the verified tokens' features (drafter work)
    forward_s: float = 0.0  # the target's verification/prefill forward
    forward_tokens: int = 0  # sum over steps of B, the tokens of the step's forward
    max_forward_tokens: int = 0
    # the speculation controller: rounds it planned, those it decoded plainly, and per proposer
    planned_rounds: int = 0
    plain_rounds: int = 0
    ngram_rounds: int = 0
    model_rounds: int = 0
    model_probes: int = 0  # model rounds that were probes (a short verification while it does not pay)

    @property
    def overhead_share(self) -> float:
        """Share of step time spent outside model forwards (target and drafter)."""
        model_s = self.forward_s + self.draft_s + self.update_s
        return 1.0 - model_s / self.step_s if self.step_s else 0.0

    @property
    def tau(self) -> float:
        """Acceptance length τ over all rounds, bonus included (DESIGN §2)."""
        return acceptance_length(self.accepted, self.rounds)
