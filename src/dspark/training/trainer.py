"""The training loop: a drafter against a frozen target (DESIGN §6).

One optimizer step = ``global_batch_size`` samples = micro-batches of
``micro_batch_size`` spread over ``world_size`` processes and ``accumulation`` backward
passes per process (``global = micro × accumulation × world``). Per micro-batch: the
target's features (:mod:`~dspark.training.online`), the drafter's ``forward_train`` and
the loss of its output (:mod:`~dspark.training.objective`); the step's objective is the
mean of the micro-batch losses, so for a fixed micro-batch size the update does not
depend on the number of processes.

Then: the global loss and gradient norm are checked — a non-finite one stops the run
*before* the optimizer touches the weights — gradients are clipped, AdamW steps on the
trainable parameters only, and the learning rate follows linear warmup then cosine.
Checkpoints (:mod:`~dspark.training.checkpoint`) resume bit for bit on CPU fp32.

:class:`~dspark.training.run.Trainer` holds the run's state and its step; this module
holds the loop (:func:`train`) and re-exports the names callers import from here.

The drafter contract used here: an ``nn.Module`` with ``config`` (a dataclass whose
``objective`` is an :class:`~dspark.drafters.objective_config.ObjectiveConfig`),
``target_layer_ids`` and ``forward_train(TrainBatch) -> TrainOutput``. The trainer scores the
output with :func:`~dspark.training.objective.compute_loss`, whose ``LossOutput`` holds the
scalar objective and the metrics it logs (:func:`metrics_log.flatten_metrics`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dspark.data.samples import TrainDataset, TrainSample
from dspark.training import distributed
from dspark.training.checkpoint import latest_checkpoint
from dspark.training.config import NonFiniteLossError, TrainConfig, TrainResult
from dspark.training.distributed import World
from dspark.training.metrics_log import MetricMeans, MetricsLog
from dspark.training.run import OnlineEval, StepStats, Trainer
from dspark.training.run_identity import default_model_config
from dspark.training.schedule import lr_multiplier

__all__ = [
    "NonFiniteLossError", "OnlineEval", "StepStats", "StopRule", "TrainConfig", "TrainResult", "Trainer",
    "interrupted_message", "lr_multiplier", "train",
]  # fmt: skip

log = logging.getLogger(__name__)

# ``stop(step, record) -> bool``: asked after every logged step; True ends the run there
# (with a checkpoint) before ``max_steps``, e.g. once expected τ stops rising.
StopRule = Callable[[int, Mapping[str, float]], bool]


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
            # Ctrl-C may land inside ``save`` after the checkpoint went in place: what is on disk says
            last_ckpt = latest_checkpoint(trainer.ckpt_root, verify=False) or last_ckpt
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
