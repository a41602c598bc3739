"""One training run's state and its step: :class:`Trainer` (DESIGN §6).

The wrapped drafter, AdamW (:mod:`~dspark.training.optimizer`), the learning-rate and
objective schedules (:mod:`~dspark.training.schedule`), the data order, and the
checkpoint round trip. :func:`dspark.training.trainer.train` drives it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dspark.data.samples import ShardedSampler, TrainDataset, collate
from dspark.drafters.objective_config import ObjectiveConfig
from dspark.errors import DsparkError
from dspark.targets.dtype import training_bf16
from dspark.training import distributed, online
from dspark.training.checkpoint import (
    Checkpoint,
    capture_rng,
    check_resumable,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    restore_rng,
    save_checkpoint,
)
from dspark.training.config import NonFiniteLossError, TrainConfig
from dspark.training.distributed import World
from dspark.training.metrics_log import MetricMeans, flatten_metrics
from dspark.training.numerics import flushing_denormals
from dspark.training.objective import compute_loss
from dspark.training.optimizer import param_groups
from dspark.training.run_identity import (
    as_json,
    default_model_config,
    identity_defaults,
    pad_id,
    run_identity,
)
from dspark.training.schedule import lr_multiplier, objective_at
from dspark.training.warm_start import warm_start_backbone

log = logging.getLogger(__name__)

# ``online_eval(drafter, step) -> {"tau": ...}``: real speculative decoding on held-out
# prompts; its results are logged as ``eval/<name>`` beside the expected τ.
OnlineEval = Callable[[nn.Module, int], Mapping[str, float]]


class _Objective(nn.Module):
    """The drafter's training forward and its loss as one module call, so DDP/FSDP see the forward.

    The loss is :func:`~dspark.training.objective.compute_loss` of the drafter's output under
    ``objective``: the drafter's own (``config.objective``), or a recipe's CE phase in its place.
    """

    def __init__(self, drafter: nn.Module) -> None:
        super().__init__()
        self.drafter = drafter
        self.objective: ObjectiveConfig = drafter.config.objective

    def forward(self, batch) -> tuple[Tensor, Any]:
        out = self.drafter.forward_train(batch)
        loss_out = compute_loss(out, self.objective)
        return loss_out.loss, loss_out  # the tensor visible, for DDP's graph traversal


_PREFIX = "drafter."


def _strip(names: Mapping[str, Any]) -> dict[str, Any]:
    return {k.removeprefix(_PREFIX): v for k, v in names.items()}


def _optimizer_names(state: Mapping[str, Any], rename: Callable[[str], str]) -> dict[str, Any]:
    groups = [{**g, "params": [rename(p) for p in g["params"]]} for g in state["param_groups"]]
    return {"state": {rename(k): v for k, v in state["state"].items()}, "param_groups": groups}


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass(frozen=True)
class StepStats:
    """One optimizer step as every rank saw it (global values)."""

    loss: float
    grad_norm: float
    lr: float  # the learning rate the step used
    tokens: int  # real tokens this rank processed


class Trainer:
    """The state of one run: the wrapped drafter, AdamW, the schedule and the data order."""

    def __init__(
        self,
        cfg: TrainConfig,
        target,
        drafter: nn.Module,
        dataset: TrainDataset,
        world: World,
        model_config: Callable[[nn.Module], dict[str, Any]] = default_model_config,
        feature_cache=None,
    ) -> None:
        online.check_feature_layers(target, drafter.target_layer_ids)
        self.cfg, self.target, self.drafter, self.dataset, self.world = cfg, target, drafter, dataset, world
        # A dspark.data.cache.FeatureCache whose samples are ``dataset``, or None for online features.
        self.feature_cache = feature_cache
        self.model_config = model_config
        self.ckpt_root = Path(cfg.output_dir) / "checkpoints"
        self.identity = run_identity(cfg, target, drafter, dataset)
        _seed_everything(cfg.seed + world.rank)

        if cfg.warm_start and latest_checkpoint(self.ckpt_root) is None:  # a resumed run has its weights
            warm_start_backbone(drafter, cfg.warm_start, target)
        if cfg.prompt_end_anchors:  # the folder it saves says it drafts a request's first round
            drafter.config = dataclasses.replace(drafter.config, prompt_end_anchors=True)
        # fp32 master weights everywhere; bf16 only inside autocast (DESIGN §6).
        drafter.to(device=world.device, dtype=torch.float32).train()
        flex = cfg.attention == "flex" or (cfg.attention == "auto" and world.device.type == "cuda")
        wanted = {"activation_checkpointing": cfg.activation_checkpointing, "flex_attention": flex}
        for flag, on in wanted.items():
            parts = [*drafter.modules(), getattr(drafter, "backbone", None)]  # held: drafters/parts.py
            holders = [m for m in parts if m is not None and hasattr(m, flag)]  # DFlash/DSpark backbones
            asked = flag == "activation_checkpointing" or cfg.attention == "flex"  # not just "auto"
            if on and asked and not holders:
                raise DsparkError(f"{type(drafter).__name__} has no {flag.replace('_', ' ')}")
            for m in holders:
                setattr(m, flag, on)
        self.model = distributed.wrap(
            _Objective(drafter), world, cfg.parallel, find_unused_parameters=cfg.find_unused_parameters
        )
        if not any(p.requires_grad for p in self.model.parameters()):
            raise DsparkError(f"{type(drafter).__name__} has no trainable parameters")
        groups, self.params = param_groups(
            self.model, _PREFIX, weight_decay=cfg.weight_decay, lr=cfg.lr, head_lr_mult=cfg.head_lr_mult
        )
        self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)
        self.objective: ObjectiveConfig = drafter.config.objective
        if cfg.ce_steps and not self.objective.tv > 0:
            raise DsparkError(
                f"ce_warmup_frac needs a drafter trained with the TV objective (DSpark); "
                f"{type(drafter).__name__}'s objective has no TV term to warm up to"
            )
        schedule = functools.partial(
            lr_multiplier,
            total_steps=cfg.max_steps,
            warmup_steps=cfg.warmup_steps,
            min_lr_ratio=cfg.min_lr_ratio,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.sampler = ShardedSampler(
            len(dataset),
            global_batch=cfg.global_batch_size,
            micro_batch=cfg.micro_batch_size,
            rank=world.rank,
            world_size=world.world_size,
            seed=cfg.seed,
        )
        self.use_bf16 = training_bf16(cfg.precision, world.device, getattr(target, "hidden_size", None))
        self.pad_id = pad_id(target)

    # -- one step ----------------------------------------------------------------------------

    def step(self, step: int, metrics: MetricMeans | None = None) -> StepStats:
        """Optimizer step ``step`` (1-based); adds the loss outputs' metrics to ``metrics`` if given.

        Raises :class:`NonFiniteLossError` before the update when the global loss or
        gradient norm is not finite.
        """
        with flushing_denormals(self.cfg.flush_denormals):
            return self._step(step, metrics)

    def _step(self, step: int, metrics: MetricMeans | None) -> StepStats:
        micro = self.sampler.next_step()
        if self.cfg.ce_steps:  # CE first, then the drafter's own objective (schedule.objective_at)
            objective = objective_at(step, ce_steps=self.cfg.ce_steps, objective=self.objective)
            distributed.unwrap(self.model).objective = objective
        loss_sum, tokens = torch.zeros((), dtype=torch.float64, device=self.world.device), 0
        for i, mb in enumerate(micro):
            generator = online.anchor_generator(self.cfg.seed, step, mb.chunk)
            dtype = None if self.use_bf16 else torch.float32  # a bf16 target's features, fp32 run
            if self.feature_cache is not None:  # offline features (DESIGN §7.3), same batch as online
                batch = self.feature_cache.target_batch(
                    mb.indices,
                    pad_id=self.pad_id,
                    num_anchors=self.cfg.num_anchors,
                    generator=generator,
                    device=self.world.device,
                    dtype=dtype or torch.float32,
                    prompt_end=self.cfg.prompt_end_anchors,
                )
            else:
                samples = [self.dataset[j] for j in mb.indices]
                tb = collate(samples, self.pad_id)
                batch = online.target_batch(
                    self.target,
                    tb.input_ids,
                    tb.loss_mask,
                    num_anchors=self.cfg.num_anchors,
                    generator=generator,
                    device=self.world.device,
                    dtype=dtype,
                    lengths=[len(s.input_ids) for s in samples] if self.cfg.pack_target else None,
                    prompt_end=self.cfg.prompt_end_anchors,
                )
            with distributed.gradient_sync(self.model, enabled=i == len(micro) - 1):
                with torch.autocast(self.world.device.type, dtype=torch.bfloat16, enabled=self.use_bf16):
                    loss, loss_out = self.model(batch)
                (loss / len(micro)).backward()  # the step's objective: the mean of micro-batch losses
            loss_sum += loss.detach().double()
            tokens += sum(len(self.dataset[j].input_ids) for j in mb.indices)  # real tokens, no padding
            if metrics is not None:
                metrics.add(flatten_metrics(loss_out))

        # A NaN on any rank reaches every rank through these two, so all ranks stop together.
        global_loss = float(distributed.all_reduce_mean(loss_sum / len(micro)))
        grad_norm = float(distributed.clip_grad_norm(self.params, self.cfg.max_grad_norm))
        if not (math.isfinite(global_loss) and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(step, global_loss, grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepStats(global_loss, grad_norm, lr, tokens)

    def evaluate(self, online_eval: OnlineEval, step: int) -> dict[str, float]:
        """Run the online evaluation on rank 0 (on every rank under FSDP, whose weights are sharded)."""
        result: Mapping[str, float] = {}
        sharded = self.world.distributed and self.cfg.parallel == "fsdp"
        self.drafter.eval()
        try:
            if self.world.is_main or sharded:
                with torch.no_grad(), distributed.full_params(self.model):
                    result = online_eval(self.drafter, step)
        finally:
            self.drafter.train()
        distributed.barrier()
        return {f"eval/{k}": float(v) for k, v in result.items()}

    # -- checkpoints ---------------------------------------------------------------------------

    def save(self, step: int) -> Path | None:
        """Gather the full state and write it on rank 0; every rank waits for the write."""
        model_state = _strip(distributed.full_model_state(self.model))
        optimizer_state = distributed.full_optimizer_state(self.model, self.optimizer)
        rng = distributed.all_gather_objects(capture_rng())
        path = None
        if self.world.is_main:
            ckpt = Checkpoint(
                step=step,
                model_state=model_state,
                model_config=self.model_config(self.drafter),
                optimizer_state=_optimizer_names(optimizer_state, lambda n: n.removeprefix(_PREFIX)),
                rng=rng,
                trainer_state={
                    "identity": self.identity,
                    "scheduler": as_json(self.scheduler.state_dict()),
                    "data": self.sampler.state_dict(),
                    "world_size": self.world.world_size,
                },
            )
            path = save_checkpoint(self.ckpt_root, ckpt)
            if self.cfg.keep_last is not None:
                prune_checkpoints(self.ckpt_root, self.cfg.keep_last)
            log.info("step %d: checkpoint %s", step, path)
        distributed.barrier()
        return path

    def resume(self, folder: Path) -> int:
        """Load a checkpoint into this freshly built run; returns its step. Every rank reads the folder."""
        ckpt = load_checkpoint(folder)
        check_resumable(
            folder,
            ckpt.trainer_state["identity"],
            self.identity,
            as_json(identity_defaults(self.cfg, self.drafter)),
        )
        distributed.load_full_state(
            self.model,
            self.optimizer,
            {_PREFIX + k: v for k, v in ckpt.model_state.items()},
            _optimizer_names(ckpt.optimizer_state, lambda n: _PREFIX + n),
        )
        self.scheduler.load_state_dict(ckpt.trainer_state["scheduler"])
        self.sampler.load_state_dict(ckpt.trainer_state["data"])
        if ckpt.trainer_state["world_size"] == self.world.world_size:
            restore_rng(ckpt.rng[self.world.rank])
        else:
            log.warning(
                "resuming %d processes from a %d-process checkpoint: per-rank random states start fresh",
                self.world.world_size,
                ckpt.trainer_state["world_size"],
            )
        if self.world.is_main:  # a resumed run says so: the user may have expected a fresh one
            log.warning("resumed from step %d of %d (checkpoint %s)", ckpt.step, self.cfg.max_steps, folder)
        return ckpt.step

    def start(self) -> tuple[int, Path | None]:
        """Resume from the latest checkpoint if there is one (and ``cfg.resume``): ``(step, folder)``."""
        folder = latest_checkpoint(self.ckpt_root)
        if folder is None:
            if self.world.is_main:
                self.ckpt_root.parent.mkdir(parents=True, exist_ok=True)
                text = json.dumps(as_json(self.identity), indent=2)
                (self.ckpt_root.parent / "train_config.json").write_text(text + "\n")
            return 0, None
        if not self.cfg.resume:
            raise DsparkError(
                f"{self.ckpt_root} already holds checkpoints; resume, or choose a new output_dir"
            )
        return self.resume(folder), folder
