"""Everything dspark does with ``torch.distributed`` (DESIGN §6): the only module importing it.

A run is launched by ``torchrun``, which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` in each process; :func:`init_from_env` turns them
into a process group (``gloo`` on CPU, ``nccl`` on GPU) and a :class:`World`. Without
them (a plain ``python`` run) the world is one process and every helper here is a no-op,
so the trainer has one code path.

Wrapping (:func:`wrap`) puts the drafter's objective behind DDP or FSDP2
(``fully_shard``); the helpers below hide the difference for gradient-sync control,
gradient clipping and full (unsharded) state dicts for checkpoints.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

log = logging.getLogger(__name__)

Strategy = Literal["ddp", "fsdp"]


@dataclass(frozen=True)
class World:
    """Where this process sits: its rank among ``world_size`` and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes checkpoints and logs."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _default_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_from_env(device: str | torch.device | None = None, *, timeout_s: float = 1800.0) -> World:
    """Join the process group described by torchrun's environment; one process without it.

    ``device`` defaults to ``cuda:LOCAL_RANK`` when CUDA is available, else the CPU; the
    backend follows the device (``nccl`` for CUDA, ``gloo`` otherwise).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    dev = torch.device(device) if device is not None else _default_device(local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=dev if dev.type == "cuda" else None,
        )
        log.info("rank %d/%d joined the %s process group on %s", rank, world_size, backend, dev)
    return World(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)


def current_world(device: str | torch.device | None = None) -> World:
    """The world of an already-initialised process group, or a single process."""
    if not dist.is_initialized():
        return World(device=torch.device(device) if device is not None else _default_device(0))
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    dev = torch.device(device) if device is not None else _default_device(local_rank)
    return World(rank=rank, world_size=dist.get_world_size(), local_rank=local_rank, device=dev)


def teardown(*, sync: bool = True) -> None:
    """Leave the process group (no-op when there is none).

    ``sync`` first waits for every rank, so that rank 0, which hosts the rendezvous
    store, does not exit while another rank still talks to it. A rank leaving on an
    error skips it: the others may be inside a different collective.
    """
    if dist.is_initialized():
        if sync:
            dist.barrier()
        dist.destroy_process_group()


@contextlib.contextmanager
def launch(device: str | torch.device | None = None) -> Iterator[World]:
    """``with launch() as world:`` — :func:`init_from_env` on entry, :func:`teardown` on exit."""
    world = init_from_env(device)
    try:
        yield world
    except BaseException:
        teardown(sync=False)
        raise
    teardown()


# -- collectives (no-ops in a single process) ----------------------------------------------


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(t: Tensor) -> Tensor:
    """The elementwise sum of ``t`` over all ranks: a new tensor on ``t``'s device."""
    if not dist.is_initialized():
        return t.detach().clone()
    # nccl reduces CUDA tensors only.
    on_cuda = dist.get_backend() == "nccl"
    out = t.detach().to(torch.device("cuda", torch.cuda.current_device()) if on_cuda else t.device, copy=True)
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.to(t.device)


def all_reduce_mean(t: Tensor) -> Tensor:
    """The elementwise mean of ``t`` over all ranks."""
    out = all_reduce_sum(t)
    return out / dist.get_world_size() if dist.is_initialized() else out


def all_gather_objects(obj: Any) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (pickled over the wire only)."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


# -- wrapping ------------------------------------------------------------------------------


def wrap(
    module: nn.Module, world: World, strategy: Strategy = "ddp", *, find_unused_parameters: bool = False
) -> nn.Module:
    """``module`` behind DDP or FSDP2 for ``world``; unchanged in a single process.

    The forward must go through ``module(...)`` for either wrapper to see it. Ranks
    start from rank 0's weights in both cases. FSDP2 makes the whole module one unit:
    parameters, gradients and optimizer state live sharded, and the weights are
    gathered for the step. Per-layer units would gather a layer only around its own
    ``forward``, but drafters also call other methods of their layers
    (``layer.context_kv``, ``layer.self_attn.project_kv``), which would then see
    sharded weights.
    """
    if not world.distributed:
        return module
    if strategy == "ddp":
        device_ids = [world.device.index] if world.device.type == "cuda" else None
        return DistributedDataParallel(
            module, device_ids=device_ids, find_unused_parameters=find_unused_parameters
        )
    if strategy == "fsdp":
        with torch.no_grad():  # DDP broadcasts rank 0's weights itself; FSDP2 does not.
            for t in module.state_dict().values():
                dist.broadcast(t, src=0)
        fully_shard(module)
        return module
    raise ValueError(f"unknown parallel strategy {strategy!r}; choose 'ddp' or 'fsdp'")


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (FSDP2 shards in place, so it is the module itself)."""
    return module.module if isinstance(module, DistributedDataParallel) else module


@contextlib.contextmanager
def gradient_sync(module: nn.Module, enabled: bool) -> Iterator[None]:
    """Whether this backward all-reduces gradients: off for all but the last micro-batch."""
    if isinstance(module, DistributedDataParallel) and not enabled:
        with module.no_sync():
            yield
    elif isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(enabled)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)
    else:
        yield


@contextlib.contextmanager
def full_params(module: nn.Module) -> Iterator[None]:
    """Unsharded parameters for calls that bypass ``forward``, like drafting (FSDP2; a no-op otherwise).

    A collective under FSDP: every rank enters it.
    """
    if not isinstance(module, FSDPModule):
        yield
        return
    module.unshard()
    try:
        yield
    finally:
        module.reshard()


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float) -> Tensor:
    """Clip the global gradient norm to ``max_norm``; returns the norm before clipping (a plain tensor).

    Under DDP the gradients are already identical on every rank; under FSDP2 they are
    sharded DTensors and the norm is reduced over the shards.
    """
    norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


# -- full state dicts for checkpoints ------------------------------------------------------


def _options(**kwargs) -> StateDictOptions:
    # Gather to rank 0 on the CPU when distributed; a single process keeps its tensors.
    return StateDictOptions(full_state_dict=True, cpu_offload=dist.is_initialized(), **kwargs)


def full_model_state(module: nn.Module) -> dict[str, Tensor]:
    """Unsharded state dict of ``module`` (DDP/FSDP prefixes removed). Empty off rank 0 when distributed."""
    return get_model_state_dict(module, options=_options())


def full_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Unsharded optimizer state keyed by parameter name: ``{"state": {name: {...}}, "param_groups": [...]}``.

    Empty off rank 0 when distributed.
    """
    return get_optimizer_state_dict(module, optimizer, options=_options())


def load_full_state(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, Tensor],
    optimizer_state: dict[str, Any],
) -> None:
    """Load full (unsharded) model and optimizer state; every rank passes the same dicts.

    The optimizer goes first: loading it into a fresh optimizer initialises the state
    with a zero-learning-rate step, and the model weights must be set after that.
    """
    options = StateDictOptions(full_state_dict=True, strict=True)
    set_optimizer_state_dict(module, optimizer, optimizer_state, options=options)
    set_model_state_dict(module, model_state, options=options)
