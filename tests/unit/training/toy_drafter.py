"""A stand-in drafter and data for trainer tests, independent of the real drafters.

It honours the trainer's contract (``config`` with an ``objective``, ``target_layer_ids``,
``forward_train``: one slot per position, which the trainer's ``compute_loss`` scores), has
a frozen part, matrices and vectors (weight decay groups). Every sample has the same length
and mask, so a micro-batch's loss normaliser does not depend on how the global batch is
cut: a 1-process and a 2-process run compute the same objective exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from dspark.data.samples import TrainSample
from dspark.drafters.objective_config import ObjectiveConfig
from dspark.protocols import TrainBatch, TrainOutput
from dspark.targets import TargetAdapter

SEQ_LEN = 12


def tiny_target(seed: int = 0) -> TargetAdapter:
    """Random-init 4-layer Qwen3 (hidden 32, vocab 64) with 2 feature layers."""
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, initializer_range=0.1,
        tie_word_embeddings=False, pad_token_id=0,
    )  # fmt: skip
    return TargetAdapter(Qwen3ForCausalLM(config).eval(), target_layer_ids=(0, 2))


def toy_samples(n: int, seed: int = 0, vocab: int = 64) -> list[TrainSample]:
    """``n`` samples of ``SEQ_LEN`` random tokens, the second half supervised."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(SEQ_LEN) >= SEQ_LEN // 2
    return [TrainSample(torch.randint(3, vocab, (SEQ_LEN,), generator=g), mask.clone()) for _ in range(n)]


@dataclass(frozen=True, kw_only=True)
class ToyConfig:
    block_size: int = 2
    target_layer_ids: tuple[int, ...] = (0, 2)
    dropout: float = 0.0
    objective: ObjectiveConfig = field(default_factory=lambda: ObjectiveConfig(ce=0.5, tv=1.0))


class ToyDrafter(nn.Module):
    """Predicts the target's logits at each supervised position from its fused features."""

    def __init__(self, config: ToyConfig, target: TargetAdapter) -> None:
        super().__init__()
        H, L, V = target.hidden_size, len(config.target_layer_ids), target.vocab_size
        self.config = config
        self.target_layer_ids = config.target_layer_ids
        self.block_size = config.block_size
        self.fc = nn.Linear(L * H, H)
        self.layers = nn.ModuleList([nn.Linear(H, H)])  # a sub-layer the online evaluation calls
        self.dropout = nn.Dropout(config.dropout)
        self.norm_weight = nn.Parameter(torch.ones(H))
        self.lm_head = nn.Linear(H, V, bias=False)
        self.lm_head.weight.data.copy_(target.model.get_output_embeddings().weight)
        self.lm_head.requires_grad_(False)
        self.nan_on_call: int | None = None  # make the loss NaN on this forward_train call (1-based)
        self.calls = 0
        self.seen: list[list[int]] = []  # first token of every sequence, per call: the data order

    @classmethod
    def from_target(cls, target: TargetAdapter, config: ToyConfig) -> ToyDrafter:
        return cls(config, target)

    def forward_train(self, batch: TrainBatch) -> TrainOutput:
        self.calls += 1
        self.seen.append(batch.input_ids[:, 0].tolist())
        B, T, L, H = batch.features.shape
        h = self.fc(batch.features.flatten(2)) * self.norm_weight  # [B, T, H]
        h = h + self.layers[0](self.dropout(h))
        logits = self.lm_head(h).unsqueeze(2)  # [B, T, 1, V]
        if self.nan_on_call == self.calls:
            logits = logits * float("nan")
        labels = torch.roll(batch.input_ids, -1, dims=1).unsqueeze(-1)  # [B, T, 1]
        return TrainOutput(
            logits=logits,
            labels=labels,
            target_logits=self.lm_head(batch.target_hidden).unsqueeze(2),  # [B, T, 1, V]
            valid=batch.loss_mask.unsqueeze(-1),
        )
