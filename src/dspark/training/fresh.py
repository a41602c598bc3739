"""Train a new drafter from its config and publish it as a drafter folder (one process).

The shared path of the sweeps and the quickstart: build the drafter for the target with
a seeded initialisation, train it (resuming from ``cfg.output_dir`` when a run is there),
and publish the last checkpoint's two files as an HF drafter folder (DESIGN §5.4).
``dspark train`` does the same under ``torch.distributed``, publishing on rank 0 only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dspark.data.samples import TrainDataset, TrainSample
from dspark.drafters.draft_vocab import choose_draft_ids
from dspark.drafters.kinds import kind_of_config
from dspark.formats.folder import drafter_config_json, publish_checkpoint
from dspark.training.trainer import TrainConfig, TrainResult, train


def train_new_drafter(
    cfg: TrainConfig,
    target,
    config,
    dataset: TrainDataset | Sequence[TrainSample],
    folder: Path,
    **options: Any,
) -> tuple[nn.Module, TrainResult]:
    """The trained drafter module and the run's result; its folder is at ``folder``.

    ``options`` go to :func:`~dspark.training.trainer.train` (``feature_cache``, ``stop``,
    ``online_eval``).
    """
    torch.manual_seed(cfg.seed)
    ids = choose_draft_ids(config, dataset, target.vocab_size)  # a reduced draft vocabulary
    drafter = kind_of_config(config).drafter_cls.from_target(target, config, draft_ids=ids)
    model_config = lambda d: drafter_config_json(d, target)  # noqa: E731
    result = train(cfg, target, drafter, dataset, model_config=model_config, **options)
    folder.parent.mkdir(parents=True, exist_ok=True)
    publish_checkpoint(result.checkpoint, folder, target)  # without the target's own tensors
    return drafter, result
