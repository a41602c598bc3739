"""One batched target forward over the variable-length token runs of many requests (DESIGN §10).

The engine's verification step sends, per request, its anchor and its scheduled drafts
(or a chunk of its prompt) through the target at once. This module runs that forward:

- **Flattened tokens.** All runs are concatenated into one sequence ``[1, N]`` with
  per-token absolute positions, so embeddings, projections, MLPs and the LM head work on
  exactly the N real tokens: no padding, whatever the spread of per-request lengths.
- **Attention per group of runs.** Attention is the only place where requests must not
  see each other. A registered HF attention function (``"dspark_flat"``, active only
  inside :func:`flat_forward`) writes each new token's keys/values into the request's
  slot of a preallocated :class:`KVStore`, then attends group by group: single-token runs
  (decode) form one group, short multi-token runs (verification) another, padded to their
  longest run (one group for both where that pads at most 2×), and every long run (a
  prefill chunk) is a group of its own. The mask is causal on absolute positions, so
  stale entries past a request's length (rejected drafts) are never read: they lie at
  positions the next run overwrites before its attention reads them.
- **Zero-copy reads.** The store is ``[slots, kv_heads, capacity, head_dim]`` per layer
  and a group attends to the contiguous slot range it covers through a view (slots in
  the range with no run get a dummy query row). Measured on CPU (R = 32, S = 300): a
  view costs 1.6 ms per layer, gathering the slots first 7.8 ms.

The HF decoder layers themselves run unchanged, so every family the adapter supports
whose attention SDPA can express works here (Qwen3, Llama, Mistral, Qwen2, Gemma3 with
sliding windows); Gemma2's attention logit softcapping cannot, and is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface

from dspark.errors import UnsupportedTargetError
from dspark.targets.adapter import TargetAdapter

ATTENTION_NAME = "dspark_flat"
# Decode and verification runs attend as one group while it pads to at most this many times
# their rows (FlatStep.build). At 3, one request verifying 8 beside 3 decoding (32 rows for 11)
# was 6-8 % slower as one group; at 2 no case measured lost more than 1.5 %, from 4 to 64
# requests (``scripts/bench_flat_groups.py`` in git history)
MERGE_PADDING = 2.0


class KVStore:
    """Preallocated keys/values of ``num_slots`` sequences of up to ``capacity`` tokens.

    ``k[layer, slot, head, position]`` (and ``v``); which request holds which slot and
    how many of its positions are valid is the engine's business (``engine/kv.py``).
    Zero-initialised: masked-out entries multiply attention weights of exactly 0, which
    would still turn a NaN bit pattern from uninitialised memory into NaN.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        capacity: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_layers, num_slots, num_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [layers, slots, kvh, cap, hd]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots, self.capacity = num_slots, capacity

    @classmethod
    def for_target(cls, target: TargetAdapter, *, num_slots: int, capacity: int) -> KVStore:
        config = target.config
        if getattr(config, "attn_logit_softcapping", None):
            raise UnsupportedTargetError(
                f"{config.model_type}: attention logit softcapping (Gemma 2) is not supported by the batched "
                "engine yet; use the batch-1 loop (dspark.decoding) for this family"
            )
        heads = config.num_attention_heads
        return cls(
            num_layers=target.num_layers,
            num_slots=num_slots,
            capacity=capacity,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            dtype=target.dtype,
            device=target.device,
        )

    @staticmethod
    def bytes_per_token(target: TargetAdapter) -> int:
        config = target.config
        heads = config.num_attention_heads
        kvh = getattr(config, "num_key_value_heads", None) or heads
        hd = getattr(config, "head_dim", None) or config.hidden_size // heads
        return 2 * target.num_layers * kvh * hd * target.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst`` (all layers)."""
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]


@dataclass(frozen=True)
class Run:
    """One request's new tokens in a step: ``length`` tokens at positions ``start ..``."""

    slot: int
    start: int  # tokens already in the slot = position of the first new token
    length: int


@dataclass
class _Group:
    """Runs attended in one padded SDPA call over the slots ``slots``: a contiguous range (a view
    of the store, slots without a run as dummy rows) or, where the runs' slots are sparse, their
    indices (the K/V of those slots gathered)."""

    slots: slice | Tensor
    kv_len: int  # keys read per row: the longest run end in the group
    gather: Tensor  # [Rg, Tg] flat index of each query row's token (padding: 0)
    rows: Tensor  # [n] positions in the flattened [Rg * Tg] outputs that are real tokens
    dst: Tensor  # [n] their flat token indices
    positions: Tensor  # [Rg, Tg] absolute position of each query row
    masks: dict[int | None, Tensor] = field(default_factory=dict)  # window -> [Rg, 1, Tg, kv_len]

    def mask(self, window: int | None) -> Tensor:
        """Causal on absolute positions; a sliding window keeps keys in ``(pos - window, pos]``."""
        if window not in self.masks:
            keys = torch.arange(self.kv_len, device=self.positions.device)  # [S]
            pos = self.positions.unsqueeze(-1)  # [Rg, Tg, 1]
            mask = keys <= pos  # [Rg, Tg, S]
            if window is not None:
                mask &= keys > pos - window
            self.masks[window] = mask.unsqueeze(1)  # [Rg, 1, Tg, S]
        return self.masks[window]


@dataclass
class FlatStep:
    """Where each flattened token goes: its slot and position, and the attention groups."""

    store: KVStore
    slots: Tensor  # [N] slot of each token
    positions: Tensor  # [N] absolute position of each token
    groups: list[_Group]

    @classmethod
    def build(cls, store: KVStore, runs: list[Run], *, short_run: int = 16) -> FlatStep:
        """Lay out ``runs`` (in flattened order); runs longer than ``short_run`` attend alone.

        Single-token runs (plain decoding) and short multi-token runs (verification) attend in
        two groups where one would pad too much: every row of a group is padded to its
        longest run, and one request verifying 8 tokens among 63 decoding made the tiny
        target's whole step 1.6× slower for 11 % more tokens (``scripts/bench_ragged_step.py`` in git history,
        BENCHMARKS.md). Where one group holds at most ``MERGE_PADDING`` times the real rows,
        they attend together: a second group is a second attention call per layer, and
        spread over the slots both groups read the whole slot range (half of 16 or 64
        requests verifying 8: the step 0.80-0.83× of the two groups' time;
        ``scripts/bench_flat_groups.py``). Index tensors are built on the store's device.
        """
        assert runs, "a step needs at least one run"
        slots, positions, offsets = [], [], []
        offset = 0
        for run in runs:
            assert run.length >= 1 and 0 <= run.slot < store.num_slots, run
            if run.start + run.length > store.capacity:
                raise ValueError(f"run {run} exceeds the KV slot capacity {store.capacity}")
            slots += [run.slot] * run.length
            positions += range(run.start, run.start + run.length)
            offsets.append(offset)
            offset += run.length
        device = store.k.device
        groups = [_build_group([(r, o)], device) for r, o in zip(runs, offsets) if r.length > short_run]
        decode = [(r, o) for r, o in zip(runs, offsets) if r.length == 1]
        verify = [(r, o) for r, o in zip(runs, offsets) if 2 <= r.length <= short_run]
        real = len(decode) + sum(r.length for r, _ in verify)
        if decode and verify and _padded_rows(decode + verify) <= MERGE_PADDING * real:
            groups.append(_build_group(decode + verify, device))
        else:
            groups += [_build_group(members, device) for members in (decode, verify) if members]
        return cls(store, torch.tensor(slots, device=device), torch.tensor(positions, device=device), groups)


def _group_rows(slots: Sequence[int]) -> tuple[bool, int]:
    """``(dense, rows)`` of a group over ``slots``: the slot range it spans (a slot without a run
    is a dummy row), or its slots alone where the range would be more than twice as many."""
    span = max(slots) - min(slots) + 1
    dense = span <= 2 * len(slots)
    return dense, span if dense else len(slots)


def _padded_rows(members: list[tuple[Run, int]]) -> int:
    """Query rows one group over ``members`` attends with: its rows times its longest run."""
    return _group_rows([run.slot for run, _ in members])[1] * max(run.length for run, _ in members)


def _build_group(members: list[tuple[Run, int]], device: torch.device) -> _Group:
    """One group over the slot range its runs span (a slot without a run is a dummy row), or over
    their slots alone where the range would be more than twice as many rows."""
    by_slot = {run.slot: (run, offset) for run, offset in members}
    assert len(by_slot) == len(members), "two runs of one slot in a step"
    lo, hi = min(by_slot), max(by_slot)
    dense, Rg = _group_rows(list(by_slot))
    order = {slot: slot - lo if dense else i for i, slot in enumerate(sorted(by_slot))}  # slot -> row
    Tg = max(run.length for run, _ in members)
    gather = torch.zeros(Rg, Tg, dtype=torch.long)  # [Rg, Tg]
    positions = torch.zeros(Rg, Tg, dtype=torch.long)  # [Rg, Tg]
    rows, dst = [], []
    for slot, (run, offset) in by_slot.items():
        i = order[slot]
        gather[i, : run.length] = torch.arange(offset, offset + run.length)
        # Padding rows repeat the last real position: never an empty (NaN) softmax row.
        positions[i] = run.start + torch.arange(Tg).clamp(max=run.length - 1)
        rows += range(i * Tg, i * Tg + run.length)
        dst += range(offset, offset + run.length)
    kv_len = max(run.start + run.length for run, _ in members)
    return _Group(
        slots=slice(lo, hi + 1) if dense else torch.tensor(sorted(by_slot), device=device),
        kv_len=kv_len,
        gather=gather.to(device),
        rows=torch.tensor(rows, device=device),
        dst=torch.tensor(dst, device=device),
        positions=positions.to(device),
    )


def _flat_attention(
    module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    dspark_step: FlatStep | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """HF attention interface for flattened runs: store the new K/V, attend per group.

    ``query [1, nh, N, hd]``, ``key``/``value [1, kvh, N, hd]`` are the new tokens only
    (the HF cache is off); returns ``[1, N, nh, hd]`` as HF attention functions do.
    """
    assert dspark_step is not None, "dspark_flat attention runs only inside flat_forward"
    if kwargs.get("softcap") is not None:
        raise UnsupportedTargetError("attention logit softcapping is not supported by the batched engine")
    step, layer = dspark_step, module.layer_idx
    store_k, store_v = step.store.k[layer], step.store.v[layer]  # [slots, kvh, cap, hd]
    # Advanced indices around a slice put the token dim first: [N, kvh, hd].
    store_k[step.slots, :, step.positions] = key[0].transpose(0, 1)
    store_v[step.slots, :, step.positions] = value[0].transpose(0, 1)
    _, nh, N, hd = query.shape
    q = query[0]  # [nh, N, hd]
    out = query.new_empty(N, nh, hd)  # [N, nh, hd]
    gqa = nh != store_k.shape[1]
    for g in step.groups:
        Rg, Tg = g.gather.shape
        qg = q[:, g.gather].transpose(0, 1)  # [Rg, nh, Tg, hd]
        k = store_k[g.slots, :, : g.kv_len]  # [Rg, kvh, S, hd]: a view (a gathered copy for indexed slots)
        v = store_v[g.slots, :, : g.kv_len]
        o = F.scaled_dot_product_attention(
            qg, k, v, attn_mask=g.mask(sliding_window), scale=scaling, enable_gqa=gqa
        )  # [Rg, nh, Tg, hd]
        out[g.dst] = o.transpose(1, 2).reshape(Rg * Tg, nh, hd)[g.rows]
    return out.unsqueeze(0), None


AttentionInterface.register(ATTENTION_NAME, _flat_attention)


@contextlib.contextmanager
def _flat_attention_mode(config):
    """Route the model's attention through ``dspark_flat`` for one forward, then restore it."""
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = previous


@dataclass(frozen=True)
class FlatOutput:
    logits: Tensor  # [n, V] fp32 at the requested rows
    features: Tensor | None  # [N, L, H] raw outputs of layer_ids for every token
    layer_ids: tuple[int, ...] = ()  # the layers of ``features``, in order (() without features)
    hidden: Tensor | None = None  # [N, H] final-normed last hidden state of every token


@torch.no_grad()
def flat_forward(
    target: TargetAdapter,
    store: KVStore,
    ids: Tensor,
    runs: list[Run],
    *,
    logits_at: Tensor,
    with_features: bool = False,
    layer_ids: Sequence[int] | None = None,
) -> FlatOutput:
    """Run the target over the flattened ``ids [N]`` of ``runs``; write their K/V to ``store``.

    ``logits_at [n]`` picks the flat rows whose logits are wanted (verification rows;
    prefill chunks need none), so the LM head runs on those rows only. With
    ``with_features``, the raw outputs of ``layer_ids`` (the drafter's; ``None``: the
    adapter's default) for every token, as in :meth:`TargetAdapter.forward`.
    """
    assert ids.dim() == 1 and ids.dtype == torch.long, f"ids must be [N] long, got {ids.dtype} {ids.shape}"
    N = ids.shape[0]
    assert sum(r.length for r in runs) == N, f"{N} ids for runs of {sum(r.length for r in runs)} tokens"
    step = FlatStep.build(store, runs)
    device = target.device
    layers = target.feature_layers(layer_ids) if with_features else ()
    captured: dict[int, Tensor] = {}
    # The adapter's own feature hooks (same package): one forward records the raw layer outputs.
    hooks = target._capture_features(captured, layers)
    decoder = target._decoder
    try:
        with _flat_attention_mode(decoder.config):
            out = decoder(
                input_ids=ids.to(device).unsqueeze(0),
                position_ids=step.positions.unsqueeze(0),
                use_cache=False,
                dspark_step=step,
            )
    finally:
        for handle in hooks:
            handle.remove()
    hidden = out.last_hidden_state[0]  # [N, H], final-normed
    features = None
    if layers:
        features = torch.stack([captured[i][0] for i in layers], dim=1)  # [N, L, H]
    logits = target.lm_head(hidden[logits_at.to(device)])
    return FlatOutput(logits=logits, features=features, layer_ids=layers, hidden=hidden)
