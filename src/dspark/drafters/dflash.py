"""DFlash: a parallel drafter with KV injection (DESIGN §5.1; paper §2, Eqs. 2-3).

:class:`DFlashDrafter` holds the DFlash backbone (:mod:`dspark.drafters.backbone`: the block
network, its context cache and its training forward) and samples every slot of the block
independently from its logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from dspark.drafters.backbone import BackboneDrafter, hold_backbone
from dspark.drafters.blocks import batch_layout, pack_blocks
from dspark.drafters.common import DecoderDims, build_from_target
from dspark.drafters.objective_config import ObjectiveConfig, dflash_objective
from dspark.drafters.request_state import assert_states, draw_drafts
from dspark.drafters.tree import SlotScores, build_trees
from dspark.protocols import DraftBlock, SamplingParams, SequenceState, TrainBatch, TrainOutput
from dspark.sampling.tree import TreeBlock, TreeConfig


@dataclass(frozen=True, kw_only=True)
class DFlashConfig:
    """A DFlash drafter. ``None`` fields are filled from the target by ``from_target``."""

    num_layers: int = 5  # draft decoder layers (paper default)
    block_size: int = 7  # γ: slots per block = drafts per round
    target_layer_ids: tuple[int, ...] | None = None  # None = the target adapter's
    mask_token_id: int | None = None  # None = the tokenizer's mask token (Qwen3: 151669)
    mask_embedding: bool = False  # a trainable mask input instead of a token (drafters/mask.py)
    # q/k-norm in the draft layers. True = DeepSpec's Qwen3 draft layer, the class vLLM and SGLang
    # load whatever the target; None = as the target family has it (Llama: none), dspark-only.
    qk_norm: bool | None = True
    # N: propose only from the N most frequent tokens of the training data
    # (drafters/draft_vocab.py). None = the target's whole vocabulary.
    draft_vocab_size: int | None = None
    # trained with the prompt's last token as an anchor too (TrainConfig.prompt_end_anchors):
    # then it drafts a request's first round (DrafterTraits.after_prompt)
    prompt_end_anchors: bool = False
    objective: ObjectiveConfig = field(default_factory=dflash_objective)

    def __post_init__(self) -> None:
        if self.num_layers < 1 or self.block_size < 1:
            raise ValueError(
                f"num_layers and block_size must be >= 1, got {self.num_layers}, {self.block_size}"
            )
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"draft_vocab_size must be >= 1, got {self.draft_vocab_size}")


class DFlashDrafter(BackboneDrafter, nn.Module):
    """The DFlash drafter: every slot of the block sampled independently from its logits."""

    def __init__(self, config: DFlashConfig, dims: DecoderDims) -> None:
        super().__init__()
        hold_backbone(self, config, dims)
        self.config = config

    @classmethod
    def from_target(cls, target, config: DFlashConfig, *, draft_ids: Tensor | None = None) -> DFlashDrafter:
        """A randomly initialised drafter for ``target`` sharing its (frozen) embedding and LM head
        (``draft_ids``: the reduced draft vocabulary of ``config.draft_vocab_size`` tokens)."""
        return build_from_target(cls, target, config, draft_ids=draft_ids)

    def forward_train(self, batch: TrainBatch) -> TrainOutput:
        """Every real block's slots ``[1, N, K]``, teacher-forced context, logits as factors (DESIGN §6)."""
        blocks = pack_blocks(batch_layout(batch, self.block_size), batch.input_ids.shape[1])
        h = self.backbone.block_hidden_train(batch, blocks).unsqueeze(0)  # [1, N, K, H]
        return TrainOutput(
            labels=blocks.labels.unsqueeze(0),
            valid=blocks.valid.unsqueeze(0),
            factors=self.backbone.slot_factors(h, batch, blocks),
        )

    def update(self, state: SequenceState, num_accepted: int, new_features: Tensor | None) -> None:
        """Absorb a verified round (:meth:`~dspark.drafters.backbone.DFlashBackbone.update`)."""
        self.backbone.update(state, num_accepted, new_features)

    @torch.no_grad()
    def propose(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams]
    ) -> DraftBlock:
        """One forward; ``min(max_len, γ)`` drafts per request from the processed slot distributions."""
        assert_states(states, max_len, sampling)
        K = min(max_len, self.block_size)
        if K == 0 or not states:
            return DraftBlock.empty(len(states), self.dims.vocab_size)
        backbone = self.backbone
        generators = backbone.prepare(states, sampling)
        logits = backbone.logits(backbone.block_hidden_infer(states)[:, :K])  # [R, K, V]
        # [R, K] target ids, [R, K, V] (None: all greedy)
        tokens, probs = draw_drafts(logits, sampling, generators, self.draft_ids, self.dims.vocab_size)
        lengths = torch.full((len(states),), K, dtype=torch.long, device=tokens.device)
        return DraftBlock(tokens=tokens, lengths=lengths, probs=probs)

    def propose_tree(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams], shape: TreeConfig
    ) -> TreeBlock:
        """A token tree per request, at most ``min(max_len, γ)`` deep (``drafters/tree.py``)."""
        return build_trees(self.tree_slots(states, max_len, sampling), shape)

    @torch.no_grad()
    def tree_slots(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams]
    ) -> SlotScores:
        """One forward scored for a token tree (``drafters/tree.py``): the base logits ``[R, K, N]``;
        every node's children are the top-k of its depth's own distribution."""
        assert_states(states, max_len, sampling)
        K = min(max_len, self.block_size)
        generators = self.backbone.prepare(states, sampling)
        h = self.backbone.block_hidden_infer(states)[:, :K]  # [R, K, H]
        anchors = torch.tensor([s.token_ids[-1] for s in states], device=h.device)  # [R]
        return SlotScores(
            base=self.backbone.logits(h),
            anchors=anchors,
            draft_ids=self.draft_ids,
            sampling=sampling,
            generators=generators,
            vocab_size=self.dims.vocab_size,
        )
