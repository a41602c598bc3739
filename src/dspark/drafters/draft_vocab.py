"""A reduced draft vocabulary: the drafter proposes only from N chosen target tokens (issue 16).

Eagle3's ``d2t`` idea, as vLLM's Eagle3/DFlash/DSpark drafters load it: the drafter's LM
head has N rows, the target's rows of the N most frequent tokens of the regenerated
training data, and draft id ``i`` stands for target id ``draft_ids[i]``. Outside those
tokens ``p_d = 0``; speculative sampling stays lossless for any ``p_d`` (its accepted /
recovered tokens follow the target whatever the draft distribution, SPEC §3), so only
the acceptance rate changes: a target token outside the set is never drafted.

Stored in the drafter as the buffer ``draft_ids [N]`` (ascending target ids). vLLM's
checkpoints hold ``d2t [N]`` as offsets (``target = draft + d2t[draft]``) and ``t2d [V]``
as a bool mask of the kept target ids (:func:`engine_tables`).

Training against the target over the reduced vocabulary (:mod:`dspark.drafters.objective`):

- TV (Eq. 10) is exact: ``‖p_d - q‖₁ = Σ_{v∈D} |p_d(v) - q(v)| + q(V∖D)``; the second term
  is the target mass the drafter can never propose (no gradient, but it lowers the
  acceptance ``1 - ½‖p_d - q‖₁ = Σ_D min(p_d, q)`` reported as expected τ).
- CE (Eq. 9): a slot whose label lies outside D contributes 0 (it cannot be drafted;
  ``-log 0`` would be infinite), as Eagle3 masks its out-of-vocabulary positions.
- soft CE (Eagle3): against ``q`` restricted to D and renormalised, as Eagle3 trains its
  reduced head; its minimiser ``q_D / q(D)`` also maximises ``Σ_D min(p_d, q)``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


def most_frequent_tokens(samples: Iterable, vocab_size: int, n: int) -> Tensor:
    """Ascending ids ``[n]`` of the ``n`` most frequent supervised tokens of ``samples``.

    Counts the tokens under each sample's loss mask (the tokens the target emitted, which
    are the only ones a drafter is asked to propose). Ties, and the ids past the last
    seen token when fewer than ``n`` occur, go to the smaller id.
    """
    if not 0 < n <= vocab_size:
        raise ValueError(f"draft vocabulary size {n} must be in 1..{vocab_size}")
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in samples:
        counts += torch.bincount(s.input_ids[s.loss_mask], minlength=vocab_size)[:vocab_size]
    # Stable sort of -count: equal counts keep ascending id order.
    order = torch.sort(-counts, stable=True).indices
    return order[:n].sort().values


def check_draft_ids(ids: Tensor, vocab_size: int) -> None:
    """Raise ValueError unless ``ids`` are strictly ascending target ids in ``0..V-1``."""
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"draft_ids must be a non-empty 1-d tensor, got shape {tuple(ids.shape)}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"draft_ids must lie in 0..{vocab_size - 1}")
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError("draft_ids must be strictly ascending")


def target_to_draft(ids: Tensor, vocab_size: int) -> Tensor:
    """``[V]`` long: the draft id of each target id, -1 where it is not in the draft vocabulary."""
    t2d = torch.full((vocab_size,), -1, dtype=torch.long, device=ids.device)
    t2d[ids] = torch.arange(ids.numel(), device=ids.device)
    return t2d


def expand_probs(p: Tensor, ids: Tensor | None, vocab_size: int) -> Tensor:
    """Draft-vocabulary probabilities ``[..., N]`` as target-vocabulary ones ``[..., V]`` (0 elsewhere)."""
    if ids is None:
        return p
    out = p.new_zeros((*p.shape[:-1], vocab_size))
    out[..., ids] = p
    return out


def engine_tables(ids: Tensor, vocab_size: int) -> dict[str, Tensor]:
    """vLLM's ``d2t`` (offsets ``[N]`` int64) and ``t2d`` (bool ``[V]``) for ``ids``."""
    ids = ids.long().cpu()
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return {"d2t": ids - torch.arange(ids.numel()), "t2d": t2d}


def ids_from_d2t(d2t: Tensor) -> Tensor:
    """Target ids ``[N]`` from vLLM's ``d2t`` offsets."""
    return d2t.long() + torch.arange(d2t.numel())
