"""The budgets of a quickstart run: the full one (< 20 min on 2 cores) and ``--fast`` (< 3 min)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

METHODS = ("dflash", "dspark", "eagle3")  # trained with the same budget, in this order
DOMAINS = ("math", "code", "chat")  # the built-in prompt sets


@dataclass(frozen=True, kw_only=True)
class QuickstartPlan:
    """What every stage does; a stage reruns when its part of the plan changes."""

    # regenerate: the target answers this many of its own training prompts (balanced over domains)
    train_prompts: int = 240
    regen_max_tokens: int = 128
    regen_temperature: float = 1.0
    # train: every method gets exactly this budget (its tiny preset's architecture)
    train_steps: int = 150
    batch_size: int = 8
    micro_batch_size: int = 4
    num_anchors: int = 64
    max_length: int = 256
    lr: float = 1e-3
    # calibrate DSpark on the built-in prompts after the evaluation ones (disjoint sets)
    calib_prompts: int = 12  # per domain
    # evaluate on the first prompts of each built-in set, temperature 1 (the paper's setting)
    eval_prompts: int = 8  # per domain
    eval_max_tokens: int = 96
    temperature: float = 1.0
    # validation set: the target's answers to the built-in prompts after the calibration ones
    # (per domain); every drafter's expected τ is measured on it (quickstart/validation.py)
    val_prompts: int = 8
    # serving sweep with the calibrated DSpark drafter behind the real HTTP server
    serve_policies: tuple[str, ...] = ("none", "fixed:1", "fixed", "prefix")
    serve_concurrency: tuple[int, ...] = (1, 4, 16)
    serve_max_tokens: int = 48
    block_size: int = 7  # γ of every drafter
    seed: int = 0

    def part(self, *names: str) -> dict[str, Any]:
        """The fields a stage depends on (its resume key)."""
        values = dataclasses.asdict(self)
        return {n: list(values[n]) if isinstance(values[n], tuple) else values[n] for n in names}


FULL = QuickstartPlan()

FAST = QuickstartPlan(
    train_prompts=24,
    regen_max_tokens=48,
    train_steps=6,
    batch_size=4,
    micro_batch_size=4,
    num_anchors=16,
    max_length=128,
    calib_prompts=3,
    eval_prompts=2,
    eval_max_tokens=32,
    val_prompts=2,
    serve_policies=("none", "prefix"),
    serve_concurrency=(1, 4),
    serve_max_tokens=24,
)
