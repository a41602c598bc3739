"""The training loop: a drafter against a frozen target (SPEC §6).

One optimizer step = ``global_batch_size`` samples = micro-batches of
``micro_batch_size`` spread over ``world_size`` processes and ``accumulation`` backward
passes per process (``global = micro × accumulation × world``). Per micro-batch: the
target's features (:mod:`~dspark.training.online`), the drafter's ``forward_train`` and
``loss``; the step's objective is the mean of the micro-batch losses, so for a fixed
micro-batch size the update does not depend on the number of processes.

Then: the global loss and gradient norm are checked — a non-finite one stops the run
*before* the optimizer touches the weights — gradients are clipped, AdamW steps on the
trainable parameters only, and the learning rate follows linear warmup then cosine.
Checkpoints (:mod:`~dspark.training.checkpoint`) resume bit for bit on CPU fp32.

The drafter contract used here: an ``nn.Module`` with ``config`` (a dataclass),
``target_layer_ids``, ``forward_train(TrainBatch) -> TrainOutput`` and
``loss(TrainOutput) -> LossOutput``, a dataclass whose ``loss`` field is the scalar
objective and whose other fields are metrics (:func:`metrics_log.flatten_metrics`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from dspark import distributed
from dspark.data.samples import ShardedSampler, TrainDataset, TrainSample, collate
from dspark.distributed import World
from dspark.errors import DsparkError
from dspark.training import online
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
from dspark.training.metrics_log import MetricMeans, MetricsLog, flatten_metrics
from dspark.training.numerics import flushing_denormals
from dspark.training.run_identity import (
    as_json,
    default_model_config,
    identity_defaults,
    pad_id,
    run_identity,
)

log = logging.getLogger(__name__)

# ``stop(step, record) -> bool``: asked after every logged step; True ends the run there
# (with a checkpoint) before ``max_steps``, e.g. once expected τ stops rising.
StopRule = Callable[[int, Mapping[str, float]], bool]

# ``online_eval(drafter, step) -> {"tau": ...}``: real speculative decoding on held-out
# prompts; its results are logged as ``eval/<name>`` beside the expected τ.
OnlineEval = Callable[[nn.Module, int], Mapping[str, float]]

_RUN_CONTROL = {"run_control": True}  # fields that may change between resumes


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
    num_anchors: int | None = 512  # per sequence (SPEC §6); None = every eligible position
    seed: int = 0
    precision: Literal["auto", "bf16", "fp32"] = "auto"  # auto: bf16 autocast on GPU, fp32 on CPU
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

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise DsparkError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.micro_batch_size < 1 or self.global_batch_size % self.micro_batch_size:
            raise DsparkError(
                f"global_batch_size {self.global_batch_size} must be a multiple of micro_batch_size "
                f"{self.micro_batch_size} (>= 1)"
            )
        if not 0.0 <= self.warmup_ratio < 1.0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise DsparkError("warmup_ratio must be in [0, 1) and min_lr_ratio in [0, 1]")
        if self.lr <= 0 or self.max_grad_norm <= 0:
            raise DsparkError("lr and max_grad_norm must be > 0")
        if self.num_anchors is not None and self.num_anchors < 1:
            raise DsparkError(f"num_anchors must be >= 1 or None, got {self.num_anchors}")
        if min(self.save_every, self.log_every, self.eval_every) < 0 or self.log_every == 0:
            raise DsparkError("save_every and eval_every must be >= 0, log_every >= 1")

    @property
    def warmup_steps(self) -> int:
        return math.ceil(self.warmup_ratio * self.max_steps)

    def identity(self) -> dict[str, Any]:
        """The fields that define the computation (everything but run control)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.metadata}


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


def lr_multiplier(step: int, *, total_steps: int, warmup_steps: int, min_lr_ratio: float = 0.0) -> float:
    """LR factor for 0-based optimizer step ``step``: linear warmup to 1, then cosine to ``min_lr_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


class _Objective(nn.Module):
    """The drafter's training forward and loss as one module call, so DDP/FSDP see the forward."""

    def __init__(self, drafter: nn.Module) -> None:
        super().__init__()
        self.drafter = drafter

    def forward(self, batch) -> tuple[Tensor, Any]:
        loss_out = self.drafter.loss(self.drafter.forward_train(batch))
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

        # fp32 master weights everywhere; bf16 only inside autocast (SPEC §6).
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
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if not trainable:
            raise DsparkError(f"{type(drafter).__name__} has no trainable parameters")
        self.params = trainable
        decay = [p for p in trainable if p.dim() >= 2]  # matrices; norms and biases are not decayed
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": cfg.weight_decay},
                {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
            ],
            lr=cfg.lr,
            betas=cfg.betas,
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
        self.use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and world.device.type == "cuda")
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
        loss_sum, tokens = torch.zeros((), dtype=torch.float64, device=self.world.device), 0
        for i, mb in enumerate(micro):
            generator = online.anchor_generator(self.cfg.seed, step, mb.chunk)
            dtype = None if self.use_bf16 else torch.float32  # a bf16 target's features, fp32 run
            if self.feature_cache is not None:  # offline features (SPEC §7.3), same batch as online
                batch = self.feature_cache.target_batch(
                    mb.indices,
                    pad_id=self.pad_id,
                    num_anchors=self.cfg.num_anchors,
                    generator=generator,
                    device=self.world.device,
                    dtype=dtype or torch.float32,
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


def interrupted_message(last_checkpoint: Path | None, cfg: TrainConfig) -> str:
    """What an interrupted run kept, and how to continue it."""
    if last_checkpoint is None:
        every = f"every {cfg.save_every} steps" if cfg.save_every else f"at step {cfg.max_steps}"
        return (
            f"interrupted before the first checkpoint (written {every}); "
            "rerunning the same command starts over"
        )
    return (
        f"interrupted; the last checkpoint is {last_checkpoint} — rerunning the same command "
        f"into the same output folder ({cfg.output_dir}) resumes from it"
    )


def train(
    cfg: TrainConfig,
    target,
    drafter: nn.Module,
    dataset: TrainDataset | Sequence[TrainSample],
    *,
    online_eval: OnlineEval | None = None,
    world: World | None = None,
    model_config: Callable[[nn.Module], dict[str, Any]] = default_model_config,
    feature_cache=None,
    stop: StopRule | None = None,
) -> TrainResult:
    """Train ``drafter`` against the frozen ``target`` on ``dataset``; resumes from the latest checkpoint.

    ``world`` comes from :func:`distributed.init_from_env` under torchrun (default: the
    current process group, or one process on the target's device). ``model_config``
    makes a checkpoint's ``config.json``. ``stop`` may end the run early at a logged step
    (the learning-rate schedule stays the one of ``max_steps``). ``feature_cache`` (a checked
    :class:`dspark.data.cache.FeatureCache` built from ``dataset``'s records) replaces the
    online target forward. Every rank calls this with the same arguments.
    The python/numpy/torch generators are seeded with ``cfg.seed + rank`` (or restored
    from the checkpoint); the drafter is moved to ``world.device`` in fp32.
    """
    started = time.perf_counter()
    world = world or distributed.current_world(target.device)
    dataset = dataset if isinstance(dataset, TrainDataset) else TrainDataset(dataset)
    trainer = Trainer(cfg, target, drafter, dataset, world, model_config, feature_cache)
    start_step, last_ckpt = trainer.start()
    logger = MetricsLog(
        cfg.output_dir,
        total_steps=cfg.max_steps,
        start_step=start_step,
        enabled=world.is_main,
        tensorboard=cfg.tensorboard,
        progress=cfg.progress,
    )
    record: dict[str, float] = {}
    tokens, since = 0, time.perf_counter()
    step = start_step
    try:
        for step in range(start_step + 1, cfg.max_steps + 1):
            eval_now = online_eval is not None and cfg.eval_every > 0 and step % cfg.eval_every == 0
            log_now = eval_now or step % cfg.log_every == 0 or step == cfg.max_steps
            metrics = MetricMeans() if log_now else None
            stats = trainer.step(step, metrics)
            tokens += stats.tokens
            if log_now:
                all_tokens = float(distributed.all_reduce_sum(torch.tensor(float(tokens))))
                record = metrics.reduce() | {
                    "loss": stats.loss,
                    "lr": stats.lr,
                    "grad_norm": stats.grad_norm,
                    "tokens_per_s": all_tokens / max(time.perf_counter() - since, 1e-9),
                    "epoch": trainer.sampler.epoch,
                }
                if eval_now:
                    record |= trainer.evaluate(online_eval, step)
                logger.write(step, record)
                tokens, since = 0, time.perf_counter()
            logger.advance({"loss": stats.loss, "lr": stats.lr})
            # Every rank logs the same steps and sees the same global record, so all stop together.
            stop_now = log_now and stop is not None and stop(step, record)
            if stop_now or step == cfg.max_steps or (cfg.save_every and step % cfg.save_every == 0):
                last_ckpt = trainer.save(step) or last_ckpt
            if stop_now:
                log.info("step %d: the stop rule ended the run before step %d", step, cfg.max_steps)
                break
    except KeyboardInterrupt:
        if world.is_main:
            log.warning("%s", interrupted_message(last_ckpt, cfg))
        raise
    finally:
        logger.close()
    return TrainResult(
        step=max(start_step, step),
        start_step=start_step,
        checkpoint=last_ckpt,
        metrics=record,
        seconds=time.perf_counter() - started,
    )
