"""The quickstart's validation set and the expected τ of any drafter on it.

The set is the target's own answers (sampled like the training data) to built-in prompts
that neither evaluation nor calibration uses, so it is held out for the drafters trained
here and for the shipped ones alike. Expected τ is the campaign's measure
(``eval/val_expected_tau``, :class:`dspark.pipeline.campaign.pipeline.TrainingEval`): per draft
position k the mean expected acceptance ``1 − ½‖p_d − p_t‖₁`` over the supervised slots
(DESIGN §6), then ``τ = 1 + Σ_k Π_{i≤k} acceptance[i]`` — on fixed samples with fixed
anchors, so two drafters are scored on exactly the same blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from dspark.data.records import read_jsonl
from dspark.data.samples import collate, tokenize_records
from dspark.formats.folder import load_drafter
from dspark.protocols import TrainBatch
from dspark.training.numerics import flushing_denormals
from dspark.training.objective import drafter_loss
from dspark.training.online import check_feature_layers, target_batch
from dspark.training.run_identity import pad_id

MICRO_BATCH = 4


def validation_batches(target, samples: Sequence, *, num_anchors: int, seed: int) -> list[TrainBatch]:
    """Fixed fp32 batches of ``samples`` with the target's features and seeded anchors."""

    batches = []
    for i in range(0, len(samples), MICRO_BATCH):
        chunk = list(samples[i : i + MICRO_BATCH])
        tokens = collate(chunk, pad_id(target))
        batches.append(
            target_batch(
                target,
                tokens.input_ids,
                tokens.loss_mask,
                num_anchors=num_anchors,
                generator=torch.Generator().manual_seed(seed + i),
                dtype=torch.float32,
            )
        )
    return batches


@torch.no_grad()
def expected_tau(drafter, target, batches: Sequence[TrainBatch]) -> float:
    """Expected τ of ``drafter`` over ``batches`` (made by :func:`validation_batches` for
    ``target``): positions pooled over all supervised slots."""

    check_feature_layers(target, drafter.target_layer_ids)  # the batches hold this target's layers
    parts = []  # (per-position mean acceptance [K], supervised slots per position [K]) per batch
    with flushing_denormals(True):
        for batch in batches:
            out = drafter.forward_train(batch)
            acceptance = drafter_loss(drafter.config, out).metrics.acceptance  # [K]
            parts.append((acceptance, out.valid.flatten(0, -2).sum(0)))
    total = sum(count for _, count in parts)
    per_pos = sum(torch.nan_to_num(a) * count for a, count in parts) / total.clamp_min(1)  # [K]
    return 1.0 + float(per_pos.cumprod(0).sum())


def read_samples(path: Path, target, max_length: int):
    """The tokenized samples of an answers file, as the trainer sees them."""

    return tokenize_records(read_jsonl(path), target.tokenizer, max_length=max_length)


def score_folders(
    target, folders: Mapping[str, Path], samples: Sequence, *, num_anchors: int, seed: int
) -> dict[str, float]:
    """Expected τ of each drafter folder on ``samples`` (loaded for ``target``, same blocks for all)."""

    batches = validation_batches(target, samples, num_anchors=num_anchors, seed=seed)
    return {name: expected_tau(load_drafter(f, target), target, batches) for name, f in folders.items()}
