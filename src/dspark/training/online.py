"""Online target features: the frozen target runs inside the training step (DESIGN §7.3).

One no-grad forward of the target over a padded micro-batch gives the raw outputs of
the drafter's feature layers and the final-normed last hidden state, which is all a
drafter needs (the target distribution at any position is ``lm_head`` of the latter;
V-sized logits are never kept). Right padding is harmless: attention is causal, so the
real tokens never see it, and it is never supervised.

Anchors are sampled here with :func:`dspark.drafters.blocks.sample_anchors` from a
generator seeded by (seed, step, chunk), so they are a pure function of where the
micro-batch sits in the run: resuming or changing the number of processes draws the
same anchors, and there is no generator state to checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dspark.drafters.blocks import batch_anchors
from dspark.errors import DsparkError
from dspark.protocols import TrainBatch
from dspark.targets.flat import KVStore, Run, flat_forward


def check_feature_layers(target, drafter_layer_ids) -> None:
    """The target adapter must produce exactly the layers the drafter reads."""
    if tuple(drafter_layer_ids) != tuple(target.target_layer_ids):
        raise DsparkError(
            f"the drafter reads target layers {tuple(drafter_layer_ids)} but the target adapter "
            f"produces {tuple(target.target_layer_ids)}; load the target with target_layer_ids="
            f"{list(drafter_layer_ids)}"
        )


def anchor_generator(seed: int, step: int, chunk: int) -> torch.Generator:
    """The CPU generator of the anchors of micro-batch ``chunk`` of optimizer step ``step``."""
    state = np.random.SeedSequence([seed, step, chunk]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


@torch.no_grad()
def target_batch(
    target,
    input_ids: Tensor,
    loss_mask: Tensor,
    *,
    num_anchors: int | None,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
    lengths: list[int] | None = None,
    prompt_end: bool = False,
) -> TrainBatch:
    """A :class:`TrainBatch` for ``input_ids [B, T]`` with the target's features, on ``device``.

    ``num_anchors=None`` leaves the anchors to the drafter (every eligible position);
    ``dtype`` casts the features and hidden states (default: the target's dtype).
    ``lengths [B]`` (the rows' real lengths) packs the rows into one flattened forward
    (:func:`packed_features`): no target work on padding, the same outputs on real tokens.
    ``prompt_end``: anchors at each prompt's last token too
    (:func:`~dspark.drafters.blocks.eligible_anchors`).
    """
    assert input_ids.shape == loss_mask.shape and input_ids.dim() == 2, (
        f"input_ids {tuple(input_ids.shape)} vs loss_mask {tuple(loss_mask.shape)}"
    )
    device = device if device is not None else target.device
    if not target.target_layer_ids:
        raise DsparkError("the target adapter has no feature layers (target_layer_ids is empty)")
    if lengths is not None:
        out = packed_features(target, input_ids, lengths)
    else:
        out = target.forward(input_ids.to(target.device), target.new_cache(), with_features=True)
    anchors = batch_anchors(loss_mask.cpu(), num_anchors, generator, prompt_end)  # [B, A] or None
    anchors = None if anchors is None else anchors.to(device)
    return TrainBatch(
        input_ids=input_ids.to(device),
        loss_mask=loss_mask.to(device),
        features=out.features.to(device, dtype),  # [B, T, L, H]
        target_hidden=out.hidden.to(device, dtype),  # [B, T, H]
        anchors=anchors,
    )


@dataclass(frozen=True)
class Features:
    features: Tensor  # [B, T, L, H], zeros on padding
    hidden: Tensor  # [B, T, H], zeros on padding


def packed_features(target, input_ids: Tensor, lengths: list[int]) -> Features:
    """The target's features of the rows of ``input_ids [B, T]``, their ``lengths`` real tokens
    run as one flattened sequence (:func:`~dspark.targets.flat.flat_forward`: every sample
    attends only to itself, positions restart at 0 per sample), scattered back to ``[B, T, ...]``.

    Projections and MLPs then run on the real tokens only, whatever the spread of lengths
    in the micro-batch; the values on real tokens are those of the padded forward.
    """

    B, T = input_ids.shape
    assert len(lengths) == B and min(lengths) > 0 and max(lengths) <= T, (lengths, T)
    runs = [Run(slot=b, start=0, length=n) for b, n in enumerate(lengths)]
    flat_ids = torch.cat([input_ids[b, :n] for b, n in enumerate(lengths)])  # [N]
    store = KVStore.for_target(target, num_slots=B, capacity=max(lengths))
    empty = torch.empty(0, dtype=torch.long)
    out = flat_forward(target, store, flat_ids, runs, logits_at=empty, with_features=True)
    real = torch.arange(T).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)  # [B, T]
    real = real.to(out.hidden.device)
    features = out.features.new_zeros(B, T, *out.features.shape[1:])  # [B, T, L, H]
    hidden = out.hidden.new_zeros(B, T, out.hidden.shape[-1])  # [B, T, H]
    features[real], hidden[real] = out.features, out.hidden  # row-major, like the flattening
    return Features(features, hidden)
