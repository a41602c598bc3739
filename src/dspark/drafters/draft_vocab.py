"""A reduced draft vocabulary: the drafter proposes only from N chosen target tokens.

Eagle3's ``d2t`` idea, as vLLM's Eagle3/DFlash/DSpark drafters load it: the drafter's LM
head has N rows, the target's rows of the N most frequent tokens of the regenerated
training data, and draft id ``i`` stands for target id ``draft_ids[i]``. Outside those
tokens ``p_d = 0``; speculative sampling stays lossless for any ``p_d`` (its accepted /
recovered tokens follow the target whatever the draft distribution, DESIGN §3), so only
the acceptance rate changes: a target token outside the set is never drafted.

Stored in the drafter as the buffer ``draft_ids [N]`` (ascending target ids). vLLM's
checkpoints hold ``d2t [N]`` as offsets (``target = draft + d2t[draft]``) and ``t2d [V]``
as a bool mask of the kept target ids (:func:`engine_tables`).

Training against the target over the reduced vocabulary (:mod:`dspark.training.objective`):

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
from torch import Tensor, nn


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


def to_file_state(state: dict[str, Tensor], vocab_size: int) -> dict[str, Tensor]:
    """A state dict as files hold it: ``draft_ids`` as vLLM's ``d2t`` / ``t2d`` (unchanged without one)."""
    if "draft_ids" not in state:
        return state
    out = {k: v for k, v in state.items() if k != "draft_ids"}
    return {**out, **engine_tables(state["draft_ids"], vocab_size)}


def from_file_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of :func:`to_file_state`; ``t2d`` must agree with ``d2t`` (ValueError otherwise)."""
    if "d2t" not in state:
        if "t2d" in state:
            raise ValueError("weights hold t2d without d2t")
        return state
    ids = ids_from_d2t(state["d2t"])
    t2d = state.get("t2d")
    if t2d is not None and not torch.equal(torch.nonzero(t2d.bool()).squeeze(-1), ids.sort().values):
        raise ValueError("the draft vocabulary tables disagree (t2d is not the set d2t maps to)")
    out = {k: v for k, v in state.items() if k not in ("d2t", "t2d")}
    out["draft_ids"] = ids
    return out


def with_draft_vocab(config, n: int | None):
    """``config`` with ``draft_vocab_size = n`` (None: unchanged, the preset's own choice)."""
    import dataclasses

    return config if n is None else dataclasses.replace(config, draft_vocab_size=n)


def choose_draft_ids(config, samples: Iterable, vocab_size: int) -> Tensor | None:
    """The draft vocabulary a new drafter of ``config`` trains with: None for the full one."""
    n = getattr(config, "draft_vocab_size", None)
    if n is None or n == vocab_size:
        return None
    return most_frequent_tokens(samples, vocab_size, n)


def register_draft_vocab(drafter: nn.Module, draft_vocab_size: int | None, vocab_size: int) -> int:
    """The buffers of a reduced draft vocabulary (:mod:`dspark.drafters.draft_vocab`); returns N.

    ``draft_ids [N]`` (saved; ``arange`` until the trainer or a checkpoint sets it) and
    ``full_head``, the target's ``[V, H]`` head: a plain attribute (never saved, never
    broadcast by DDP) that the training loss's target distribution needs and drafting does
    not. Both are None for the full vocabulary.
    """
    drafter.full_head = None
    if draft_vocab_size is None or draft_vocab_size == vocab_size:
        drafter.register_buffer("draft_ids", None)
        return vocab_size
    if not 0 < draft_vocab_size < vocab_size:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} must be in 1..{vocab_size}")
    drafter.register_buffer("draft_ids", torch.arange(draft_vocab_size))
    return draft_vocab_size


def draft_to_target(tokens: Tensor, probs: Tensor, draft_ids: Tensor | None, vocab_size: int):
    """Sampled draft ids ``[R, K]`` and their probabilities ``[R, K, N]`` in target ids / ``[R, K, V]``."""
    if draft_ids is None:
        return tokens, probs
    return draft_ids[tokens], expand_probs(probs, draft_ids, vocab_size)


def set_full_head(drafter: nn.Module, head: Tensor | None) -> None:
    """Give ``drafter`` (and the backbone it holds, drafters/parts.py) the target's full head, or drop it."""
    drafter.full_head = head
    backbone = drafter.__dict__.get("backbone")
    if backbone is not None:
        backbone.full_head = head
