"""Drafter files without the target's frozen embedding and LM head.

Every feature-conditioned drafter holds frozen copies of the target's ``embed_tokens``
and ``lm_head`` (DESIGN §2); for SmolLM2 they are 56 MB in bf16, more than the whole
trained drafter. A drafter folder leaves out each copy that equals the target's (the LM
head: its rows of ``draft_ids`` under a reduced draft vocabulary) and records, in
``config.json``, which keys it left out and the sha256 of the target tensors they come
from (:func:`target_fingerprint`). The loader re-attaches them from the target after
checking the fingerprint, and a folder of another target is refused in one line. A
folder that holds the tensors (every folder written before this) loads as before.
Exports for engines that need them write them from the target (the export takes the
loaded drafter's whole state dict).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import Tensor

SHARED_KEYS = ("embed_tokens.weight", "lm_head.weight")
RECORD_FIELD = "dspark_shared_weights"  # config.json: {"omitted": [keys], "target_sha256": hex}


def _target_tensors(target) -> dict[str, Tensor]:
    return {
        "embed_tokens.weight": target.model.get_input_embeddings().weight.detach(),
        "lm_head.weight": target.model.get_output_embeddings().weight.detach(),
    }


def target_fingerprint(target) -> str:
    """sha256 of the target's embedding and LM head, as bf16 bytes (the same for a bf16 or fp32 load)."""
    digest = hashlib.sha256()
    for name, t in _target_tensors(target).items():
        digest.update(f"{name}:{tuple(t.shape)};".encode())
        digest.update(t.to(torch.bfloat16).contiguous().cpu().view(torch.int16).numpy().tobytes())
    return digest.hexdigest()


def target_copy(target, key: str, draft_ids: Tensor | None) -> Tensor:
    """What a drafter's ``key`` holds when it is the target's: the LM head's rows of ``draft_ids``."""
    t = _target_tensors(target)[key]
    if key == "lm_head.weight" and draft_ids is not None:
        t = t[draft_ids.to(t.device)]
    return t


def strip_shared(state: dict[str, Tensor], target) -> tuple[dict[str, Tensor], dict[str, Any] | None]:
    """``state`` without the copies that equal the target's (in the state's dtype), and the record.

    ``state`` is a drafter's state dict (``draft_ids`` when reduced, not yet ``d2t``). A copy
    that differs (a drafter made for another target, rounding of another dtype) is kept.
    """
    ids = state.get("draft_ids")
    omitted = []
    for key in SHARED_KEYS:
        if key not in state:
            continue
        theirs = target_copy(target, key, ids)
        mine = state[key]
        if mine.shape == theirs.shape and torch.equal(mine, theirs.to(device=mine.device, dtype=mine.dtype)):
            omitted.append(key)
    if not omitted:
        return state, None
    kept = {k: v for k, v in state.items() if k not in omitted}
    return kept, {"omitted": omitted, "target_sha256": target_fingerprint(target)}


def check_record(record: Any, target) -> list[str]:
    """The keys a config.json record omits; ValueError (one line) if malformed or of another target."""
    if not isinstance(record, dict) or not isinstance(record.get("omitted"), list):
        raise ValueError(f"{RECORD_FIELD} must be an object with an 'omitted' list")
    keys = record["omitted"]
    unknown = [k for k in keys if k not in SHARED_KEYS]
    if unknown:
        raise ValueError(f"{RECORD_FIELD} omits {unknown}, which are not the target's shared tensors")
    if record.get("target_sha256") != target_fingerprint(target):
        raise ValueError(
            "drafter was trained for another target: its embedding / LM head were left out of the file "
            "and this target's do not match the sha256 recorded in config.json"
        )
    return list(keys)
