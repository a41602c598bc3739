"""Profiling SPS(B) of a target with the engine's own batched forward (DESIGN §9).

The scheduler's cost table must describe the forward the engine really runs, so a step
of B tokens here is a :func:`~dspark.targets.flat.flat_forward` of ``min(B, slots)``
requests with ``context`` tokens cached each, the B tokens spread as evenly as possible
over them (B <= slots: pure decode; beyond: verification runs), logits at every token.
The table is saved per target, dtype, device, thread count and engine shape, and loaded
instead of re-measured when it exists.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dspark.scheduler import SpsTable, default_sizes, measure_sps
from dspark.targets import TargetAdapter
from dspark.targets.flat import MERGE_PADDING, KVStore, Run, flat_forward
from dspark.user_cache import sps_dir

logger = logging.getLogger(__name__)


# Config fields that do not change what a forward costs: a copy of the same model elsewhere,
# or with other special tokens, shares its profile (a path-keyed table made each copied tree
# profile afresh under that moment's load).
_NOT_COST = frozenset(
    {"_name_or_path", "name_or_path", "transformers_version", "architectures", "_commit_hash",
     "bos_token_id", "eos_token_id", "pad_token_id", "dtype", "torch_dtype"}
)  # fmt: skip


def architecture_digest(config) -> str:
    """A hash of the config's fields that shape the forward (sizes, attention, rope, ...), not
    of its path or weights: what a step costs depends on those alone."""
    fields = {k: v for k, v in config.to_dict().items() if k not in _NOT_COST}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def pricing_clock(device: torch.device | str, threads: int | None = None) -> Callable[[], float]:
    """The clock step and drafting seconds are measured on (profiles and the controller's prices).

    A CPU target on one thread runs every forward in the engine's thread: that thread's CPU
    time (``time.thread_time``) is what the engine spends, and unlike wall time it does not
    count the time other processes of a shared machine hold the core (on a 3x oversubscribed
    machine, wall-clock steps swing 2x between neighbours). With several threads (whose waits
    may sleep) or on an accelerator, wall time."""
    threads = torch.get_num_threads() if threads is None else threads
    if torch.device(device).type == "cpu" and threads == 1:
        return time.thread_time
    return time.perf_counter


def profile_clock(target: TargetAdapter) -> tuple[str, Callable[[], float]]:
    """``(name, clock)`` a profile is timed on: the controller's (:func:`pricing_clock`), so a
    profile taken while other processes hold the cores is the one an idle machine gives
    (wall-clock profiles taken under load were 3-6x too slow at small B)."""
    clock = pricing_clock(target.device)
    return ("thread" if clock is time.thread_time else "wall"), clock


def profile_key(target: TargetAdapter, *, num_slots: int, block_size: int, context: int) -> dict:
    """What an SPS table depends on; its hash names the saved file."""
    config = target.config
    return {
        "target": str(config.model_type),
        "architecture": architecture_digest(config),
        "layers": target.num_layers,
        "hidden": target.hidden_size,
        "vocab": target.vocab_size,
        "dtype": str(target.dtype),
        "device": str(target.device),
        "threads": torch.get_num_threads(),
        "slots": num_slots,
        "block_size": block_size,
        "context": context,
        "clock": profile_clock(target)[0],
        # how a step's runs attend (targets/flat.py): a table of another layout prices other steps
        "merge_padding": MERGE_PADDING,
    }


PROFILE_CONTEXT = 256  # tokens cached per request in a profiled step


def default_profile_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return sps_dir() / f"{digest}.json"


def step_runs(num_tokens: int, num_slots: int, context: int) -> list[Run]:
    """``num_tokens`` spread over ``min(num_tokens, num_slots)`` requests, ``context`` cached each."""
    R = min(num_tokens, num_slots)
    base, extra = divmod(num_tokens, R)
    return [Run(slot=r, start=context, length=base + (r < extra)) for r in range(R)]


def profile_sps(
    target: TargetAdapter,
    store: KVStore,
    *,
    block_size: int,
    context: int | None = None,
    sizes: list[int] | None = None,
    repeats: int = 5,
) -> SpsTable:
    """Measure SPS(B) for B up to ``slots * (block_size + 1)`` on ``store`` (its contents are clobbered)."""
    max_tokens = store.num_slots * (block_size + 1)
    context = min(context or PROFILE_CONTEXT, store.capacity - block_size - 1)
    if context < 0:
        raise ValueError(
            f"KV slots of {store.capacity} tokens are too small to profile block size {block_size}"
        )
    g = torch.Generator().manual_seed(0)

    def step(num_tokens: int) -> None:
        runs = step_runs(num_tokens, store.num_slots, context)
        ids = torch.randint(0, target.vocab_size, (num_tokens,), generator=g)
        flat_forward(target, store, ids, runs, logits_at=torch.arange(num_tokens))

    key = profile_key(target, num_slots=store.num_slots, block_size=block_size, context=context)
    table = measure_sps(
        step, sizes or default_sizes(max_tokens), repeats=repeats, meta=key, clock=profile_clock(target)[1]
    )
    logger.info(
        "profiled SPS: B=1 %.1f steps/s, B=%d %.1f steps/s",
        table(1),
        table.max_tokens,
        table(table.max_tokens),
    )
    return table


def load_or_profile(
    target: TargetAdapter, store: KVStore, *, block_size: int, path: Path | None = None
) -> SpsTable:
    """The saved table for this target and engine shape, profiling (and saving) it if missing.

    Steps are priced at :data:`PROFILE_CONTEXT` cached tokens per request whatever this
    engine's slots hold: an engine whose slots are smaller (a one-request ``generate`` sizes
    its slot to the request) is profiled on a store of its own, so that a short request can
    always be served and engines that differ only in slot size share one table.
    """
    context = min(PROFILE_CONTEXT, target.max_context - block_size - 1)
    key = profile_key(target, num_slots=store.num_slots, block_size=block_size, context=context)
    path = Path(path) if path is not None else default_profile_path(key)
    if path.is_file():
        table = SpsTable.load(path)
        if table.meta != key:
            logger.warning("SPS profile %s was measured for %s, not %s", path, table.meta, key)
        return table
    logger.warning("no SPS profile at %s: profiling the target now (once)", path)
    if store.capacity < context + block_size + 1:
        store = KVStore.for_target(target, num_slots=store.num_slots, capacity=context + block_size + 1)
    table = profile_sps(target, store, block_size=block_size, context=context)
    table.save(path)
    return table
