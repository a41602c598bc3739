"""How a training run is configured, and what it returns (DESIGN §6).

:class:`TrainConfig` is the run's frozen description; its :meth:`~TrainConfig.identity`
(every field but run control) is stored in each checkpoint and must match on resume
(:mod:`dspark.training.run_identity`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dspark.errors import DsparkError

_RUN_CONTROL = {"run_control": True}  # fields that may change between resumes
_RECIPE = {"recipe": True}  # in the identity only when set (a default run's identity is unchanged)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train. Fields marked run-control may change on resume; any other change is refused."""

    output_dir: str = field(metadata=_RUN_CONTROL)
    max_steps: int
    global_batch_size: int = 8
    micro_batch_size: int = 1
    lr: float = 6e-4
    min_lr_ratio: float = 0.0  # cosine floor, as a fraction of lr
    warmup_ratio: float = 0.04
    weight_decay: float = 0.01  # matrices only; norms and biases are not decayed
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = 1.0
    num_anchors: int | None = 512  # per sequence (DESIGN §6); None = every eligible position
    seed: int = 0
    # auto: bf16 autocast on GPU and on CPUs with AMX, fp32 on other CPUs (targets/dtype.py)
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    # CPU: treat subnormal floats as zero during the run. The loss's softmaxes are full of
    # probabilities below 1e-38; each one costs a microcode assist on x86, and on the tiny
    # target that doubled a step's time (BENCHMARKS.md, "Training throughput").
    flush_denormals: bool = True
    # Recompute the draft layers' activations in the backward (less memory, same loss and
    # gradients, ≈ one more drafter forward); DFlash/DSpark only.
    activation_checkpointing: bool = field(default=False, metadata=_RUN_CONTROL)
    # Packed-block attention of DFlash/DSpark: "flex" = flex attention (compiled on CUDA),
    # "packed" = attend_packed_blocks; "auto" = flex on CUDA, packed elsewhere. Same outputs.
    attention: Literal["auto", "packed", "flex"] = field(default="auto", metadata=_RUN_CONTROL)
    # Online features: run the micro-batch's samples through the target as one flattened
    # sequence (no work on padding; online.packed_features) instead of a padded batch.
    pack_target: bool = field(default=False, metadata=_RUN_CONTROL)
    parallel: Literal["ddp", "fsdp"] = field(default="ddp", metadata=_RUN_CONTROL)
    find_unused_parameters: bool = field(default=False, metadata=_RUN_CONTROL)
    save_every: int = field(default=1000, metadata=_RUN_CONTROL)  # 0: only at the end
    keep_last: int | None = field(default=None, metadata=_RUN_CONTROL)  # None: keep all
    log_every: int = field(default=10, metadata=_RUN_CONTROL)
    eval_every: int = field(default=0, metadata=_RUN_CONTROL)  # 0: no online evaluation
    tensorboard: bool = field(default=False, metadata=_RUN_CONTROL)
    progress: bool = field(default=True, metadata=_RUN_CONTROL)
    resume: bool = field(default=True, metadata=_RUN_CONTROL)  # continue from <output_dir>/checkpoints/latest
    # Recipes beside the paper's (README "Training recipes"). The defaults are the
    # paper's recipe, and a field left at its default stays out of the run identity, so the
    # identity of a default run is the one earlier dspark wrote (and resumes).
    # A trained DFlash drafter folder whose backbone initialises a DSpark drafter's (fresh runs
    # only; the sequential and confidence heads start from their own initialisation).
    warm_start: str | None = field(default=None, metadata=_RECIPE)
    # Train on cross-entropy alone (plus the confidence term) for this fraction of max_steps,
    # then on the drafter's own objective (DSpark: the paper's CE + TV + confidence, Eq. 12).
    ce_warmup_frac: float = field(default=0.0, metadata=_RECIPE)
    # The sequential (Markov/RNN) head's learning rate, as a multiple of lr (same schedule).
    head_lr_mult: float = field(default=1.0, metadata=_RECIPE)
    # Anchor blocks at each prompt's last token too (DESIGN §6 anchors response tokens only), so
    # that the drafter learns an answer's first tokens and drafts a request's first round.
    prompt_end_anchors: bool = field(default=False, metadata=_RECIPE)

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise DsparkError(f"max_steps must be >= 1, got {self.max_steps}")
        if min(self.micro_batch_size, self.global_batch_size) < 1 or (
            self.global_batch_size % self.micro_batch_size
        ):
            raise DsparkError(
                f"global_batch_size {self.global_batch_size} must be a multiple of micro_batch_size "
                f"{self.micro_batch_size} (both >= 1)"
            )
        if not 0.0 <= self.warmup_ratio < 1.0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise DsparkError("warmup_ratio must be in [0, 1) and min_lr_ratio in [0, 1]")
        if not all(0 < v < math.inf for v in (self.lr, self.max_grad_norm)):  # NaN fails too
            raise DsparkError(
                f"lr and max_grad_norm must be finite numbers > 0, got {self.lr} and {self.max_grad_norm}"
            )
        if self.num_anchors is not None and self.num_anchors < 1:
            raise DsparkError(f"num_anchors must be >= 1 or None, got {self.num_anchors}")
        if min(self.save_every, self.log_every, self.eval_every) < 0 or self.log_every == 0:
            raise DsparkError("save_every and eval_every must be >= 0, log_every >= 1")
        if not 0.0 <= self.ce_warmup_frac < 1.0:
            raise DsparkError(f"ce_warmup_frac must be in [0, 1), got {self.ce_warmup_frac}")
        if not self.head_lr_mult > 0:
            raise DsparkError(f"head_lr_mult must be > 0, got {self.head_lr_mult}")

    @property
    def warmup_steps(self) -> int:
        return math.ceil(self.warmup_ratio * self.max_steps)

    @property
    def ce_steps(self) -> int:
        """Optimizer steps 1..ce_steps train on cross-entropy (:func:`schedule.objective_at`)."""
        return round(self.ce_warmup_frac * self.max_steps)

    def identity(self) -> dict[str, Any]:
        """The fields that define the computation: all but run control, and recipes left at their default."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("run_control") or (f.metadata.get("recipe") and value == f.default):
                continue
            out[f.name] = value
        return out


@dataclass(frozen=True)
class TrainResult:
    step: int  # last completed optimizer step
    start_step: int  # 0 for a fresh run, else the step resumed from
    checkpoint: Path | None  # the newest checkpoint
    metrics: dict[str, float]  # the last logged record (rank 0; empty elsewhere)
    seconds: float


class NonFiniteLossError(DsparkError):
    """The loss or gradient norm of a step was NaN/inf; the step's update was not applied."""

    def __init__(self, step: int, loss: float, grad_norm: float) -> None:
        self.step = step
        super().__init__(
            f"non-finite loss ({loss}) or gradient norm ({grad_norm}) at step {step}; stopped before its "
            f"optimizer update, so the weights are those after step {step - 1}. Lower the learning rate or "
            "check the data, then resume from the last checkpoint."
        )
