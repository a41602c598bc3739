"""The one place a :class:`~dspark.training.trainer.TrainConfig` is built.

``dspark train``, the quickstart, the campaign and the sweeps each describe a run by a
*recipe* with the same field names (a plan, a sweep budget, parsed arguments):
``batch_size``, ``micro_batch_size``, ``lr``, ``num_anchors``, ``seed``. :func:`train_config`
maps a recipe onto the trainer's fields, so that mapping (``batch_size`` is the *global*
batch) is written once; what differs per caller (steps, checkpoint and log cadence,
parallelism, progress) is passed as keywords and defaults to ``TrainConfig``'s own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from dspark.training.trainer import TrainConfig


class TrainRecipe(Protocol):
    """What every training caller's plan holds, under these names."""

    batch_size: int  # samples per optimizer step, over all processes
    micro_batch_size: int
    lr: float
    num_anchors: int | None
    seed: int


def train_config(output_dir: str | Path, recipe: TrainRecipe, *, max_steps: int, **run: Any) -> TrainConfig:
    """The ``TrainConfig`` of ``recipe`` writing to ``output_dir``; ``run`` sets any other field."""
    return TrainConfig(
        output_dir=str(output_dir),
        max_steps=max_steps,
        global_batch_size=recipe.batch_size,
        micro_batch_size=recipe.micro_batch_size,
        lr=recipe.lr,
        num_anchors=recipe.num_anchors,
        seed=recipe.seed,
        **run,
    )
