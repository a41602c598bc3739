"""What changes with the optimizer step: the learning rate and the objective (DESIGN §6)."""

from __future__ import annotations

import dataclasses
import math

from dspark.drafters.objective_config import ObjectiveConfig


def lr_multiplier(step: int, *, total_steps: int, warmup_steps: int, min_lr_ratio: float = 0.0) -> float:
    """LR factor for 0-based optimizer step ``step``: linear warmup to 1, then cosine to ``min_lr_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def ce_objective(objective: ObjectiveConfig) -> ObjectiveConfig:
    """The cross-entropy phase of ``objective``: its TV weight moved onto CE (Eq. 9 in place of Eq. 10).

    DSpark's ``0.1 CE + 0.9 TV + 1.0 conf`` becomes ``1.0 CE + 1.0 conf`` (DFlash's loss plus
    the confidence term); the position weighting is kept.
    """
    return dataclasses.replace(objective, ce=objective.ce + objective.tv, tv=0.0)


def objective_at(step: int, *, ce_steps: int, objective: ObjectiveConfig) -> ObjectiveConfig:
    """The objective of 1-based optimizer step ``step``: CE for steps ``1..ce_steps``, then ``objective``."""
    return ce_objective(objective) if step <= ce_steps else objective
