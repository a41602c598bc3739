"""Warm start: a DSpark drafter's backbone from a trained DFlash drafter (the training recipes).

DSpark holds the DFlash backbone under the backbone's own weight names
(:func:`dspark.drafters.parts.hold`), so a DFlash drafter folder's tensors are DSpark
tensors of the same name. :func:`warm_start_backbone` loads the folder with every check
of a drafter folder against the target (:func:`dspark.formats.folder.load_drafter`),
refuses a backbone of another architecture, and copies its tensors; the sequential and
confidence heads, which DFlash has not, keep their fresh initialisation. A trained DSpark
folder warm-starts every tensor, heads included: a shipped drafter trained on with another
recipe (say ``prompt_end_anchors``) for a fraction of its budget.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from dspark.drafters.dflash import DFlashDrafter
from dspark.drafters.dspark import DSparkDrafter
from dspark.errors import DsparkError
from dspark.formats.folder import load_drafter

log = logging.getLogger(__name__)

HEADS = ("markov_head.", "confidence_head.")  # DSpark's own parts (drafters/dspark.py)
# Backbone choices that change no tensor shape but do change what the weights mean.
_SAME = ("num_layers", "block_size", "target_layer_ids", "mask_token_id", "mask_embedding", "qk_norm")


def warm_start_backbone(drafter: nn.Module, folder: str | Path, target) -> list[str]:
    """Copy the DFlash drafter at ``folder`` into ``drafter``'s backbone (a DSpark drafter's: into
    all of it); returns the keys copied."""

    if not isinstance(drafter, DSparkDrafter):
        raise DsparkError(
            f"warm start initialises a DSpark drafter's backbone, not a {type(drafter).__name__}"
        )
    source = load_drafter(folder, target)
    whole = isinstance(source, DSparkDrafter)
    if not isinstance(source, DFlashDrafter) and not whole:
        raise DsparkError(
            f"warm start needs a DFlash or DSpark drafter folder; {folder} holds a {type(source).__name__}"
        )
    differ = [
        f"{name} {getattr(source.config, name)!r} != {getattr(drafter.config, name)!r}"
        for name in _SAME
        if getattr(source.config, name) != getattr(drafter.config, name)
    ]
    theirs, ours = source.state_dict(), drafter.state_dict()
    differ += [f"{k} is not a DSpark weight" for k in sorted(set(theirs) - set(ours))]
    differ += [
        f"{k} {tuple(v.shape)} != {tuple(ours[k].shape)}"
        for k, v in theirs.items()
        if k in ours and v.shape != ours[k].shape
    ]
    own = sorted(k for k in set(ours) - set(theirs) if whole or not k.startswith(HEADS))
    differ += [f"the {type(source).__name__} folder lacks {k}" for k in own]
    if (
        "draft_ids" in theirs
        and "draft_ids" in ours
        and not torch.equal(theirs["draft_ids"], ours["draft_ids"])
    ):
        differ.append("its draft vocabulary (draft_ids) is another one")
    if differ:
        raise DsparkError(f"cannot warm-start from {folder}: its backbone does not fit ({'; '.join(differ)})")
    with torch.no_grad():
        for k, v in theirs.items():
            ours[k].copy_(v)  # state_dict tensors share storage with the drafter's
    log.info(
        "warm start: %d tensors from %s%s", len(theirs), folder, "" if whole else "; the heads start fresh"
    )
    return sorted(theirs)
