"""Builders shared by the drafter tests: each drafter on a tiny target, states and batches.

Every drafter is random-init (seeded) on the ``tiny_qwen3`` fixture of tests/conftest.py
(hidden 64, vocab 128, 4 layers). The Markov/RNN heads start with ``W_2 = 0``, which
would make them invisible; :func:`build` re-draws ``W_2`` so that a wrong previous token
or a wrong head equation moves the logits well beyond test tolerances.
"""

from __future__ import annotations

import dataclasses

import torch

from dspark.drafters.dflash import DFlashConfig, DFlashDrafter
from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
from dspark.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from dspark.protocols import SequenceState, TrainBatch
from dspark.targets import TargetAdapter

MASK_ID = 127  # unused by the random tiny target's prompts below (ids 3..100)
BLOCK = 4

CONFIGS = {
    "dflash": (DFlashDrafter, DFlashConfig(num_layers=2, block_size=BLOCK, mask_token_id=MASK_ID)),
    "dspark_markov": (
        DSparkDrafter,
        DSparkConfig(num_layers=2, block_size=BLOCK, mask_token_id=MASK_ID, markov_rank=8),
    ),
    "dspark_rnn": (
        DSparkDrafter,
        DSparkConfig(
            num_layers=2, block_size=BLOCK, mask_token_id=MASK_ID, markov_rank=8, markov_head_type="rnn"
        ),
    ),
    "eagle3": (Eagle3Drafter, Eagle3Config(block_size=BLOCK)),
}
DRAFTERS = list(CONFIGS)


def build(name: str, target: TargetAdapter, seed: int = 0, **overrides):
    """Drafter ``name`` on ``target``, seeded, with a visible sequential head."""
    cls, config = CONFIGS[name]
    torch.manual_seed(seed)
    drafter = cls.from_target(target, dataclasses.replace(config, **overrides)).eval()
    head = getattr(drafter, "markov_head", None)
    if head is not None:
        with torch.no_grad():
            head.markov_w2.weight.normal_(std=0.5)
    return drafter


def make_state(target: TargetAdapter, token_ids: list[int], request_id: int = 0) -> SequenceState:
    """A state whose anchor is ``token_ids[-1]``, with the target's features of the rest."""
    state = SequenceState(request_id=request_id, token_ids=list(token_ids), prompt_len=len(token_ids))
    out = target.forward(torch.tensor([token_ids[:-1]]), target.new_cache())
    state.features = out.features[0]  # [T-1, L, H]
    return state


def make_batch(target: TargetAdapter, ids: torch.Tensor, loss_mask: torch.Tensor, anchors=None) -> TrainBatch:
    """A training batch of ``ids [B, T]`` with the target's features and final hidden states."""
    out = target.forward(ids, target.new_cache())
    return TrainBatch(
        input_ids=ids, loss_mask=loss_mask, features=out.features, target_hidden=out.hidden, anchors=anchors
    )


def prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 100, (n,), generator=g).tolist()
