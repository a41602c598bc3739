"""The batched forward over flattened runs gives the logits of a plain HF forward (targets/flat.py),
and the KV memory's rollback and slot moves keep them so (engine/kv.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma2ForCausalLM

from dspark.engine.kv import KVMemory
from dspark.errors import UnsupportedTargetError
from dspark.targets import TargetAdapter, TargetCache
from dspark.targets.flat import FlatStep, KVStore, Run, flat_forward

FAMILIES = ["tiny_qwen3", "tiny_llama", "tiny_gemma3"]


def reference_logits(target: TargetAdapter, seq: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return target.model(seq.unsqueeze(0)).logits[0].float()  # [T, V]


def run_step(target, store, seqs, done, chunk, slots, *, features=False):
    """Advance each sequence r by ``chunk[r]`` tokens in one flat forward; returns (output, rows)."""
    runs, ids, who = [], [], []
    for r, n in enumerate(chunk):
        if n:
            runs.append(Run(slot=slots[r], start=done[r], length=n))
            ids.append(seqs[r][done[r] : done[r] + n])
            who += [(r, p) for p in range(done[r], done[r] + n)]
            done[r] += n
    out = flat_forward(
        target, store, torch.cat(ids), runs, logits_at=torch.arange(len(who)), with_features=features
    )
    return out, who


@pytest.mark.parametrize("family", FAMILIES)
def test_flat_forward_equals_hf_forward(request, family):
    """Long prefill chunks (own groups) and short decode runs (one group, with a dummy row
    for a slot that has no run this step), for Qwen3, Llama and Gemma3 (sliding window)."""
    target = TargetAdapter(request.getfixturevalue(family))
    store = KVStore.for_target(target, num_slots=4, capacity=64)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 128, (n,), generator=g) for n in (40, 12, 30)]
    refs = [reference_logits(target, s) for s in seqs]
    done, slots = [0, 0, 0], [3, 0, 1]  # slot 2 stays empty: a dummy row in the short group
    for chunk in ([20, 5, 17], [3, 1, 8], [8, 6, 5], [9, 0, 0]):
        out, who = run_step(target, store, seqs, done, chunk, slots)
        for i, (r, p) in enumerate(who):
            torch.testing.assert_close(out.logits[i], refs[r][p], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["tiny_qwen3", "tiny_gemma3"])
def test_decoding_and_verifying_runs_attend_apart_over_sparse_slots(request, family):
    """Single-token runs and short multi-token runs form two groups where one would pad too
    much (no row padded to another request's verification), and a group whose slots are
    sparse gathers them instead of spanning the range with dummy rows; the logits stay the
    plain forward's."""
    target = TargetAdapter(request.getfixturevalue(family))
    store = KVStore.for_target(target, num_slots=8, capacity=64)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, 128, (n,), generator=g) for n in (30, 24, 26, 28, 22, 30)]
    refs = [reference_logits(target, s) for s in seqs]
    done, slots = [0] * 6, [0, 2, 3, 4, 5, 7]
    # a prefill, then decode steps in which the requests in slots 0 and 7 verify 6 and 5 tokens
    chunks = ([12, 10, 11, 12, 10, 12], [6, 1, 1, 1, 1, 5], [1, 1, 1, 1, 1, 1], [6, 1, 1, 1, 1, 5])
    for chunk in chunks:
        runs = [Run(slot=slots[r], start=done[r], length=n) for r, n in enumerate(chunk)]
        step = FlatStep.build(store, runs)
        out, who = run_step(target, store, seqs, done, chunk, slots)
        for i, (r, p) in enumerate(who):
            torch.testing.assert_close(out.logits[i], refs[r][p], atol=2e-5, rtol=1e-4)
        if chunk[0] == 6:
            shapes = sorted(tuple(group.gather.shape) for group in step.groups)
            assert shapes == [(2, 6), (4, 1)]  # slots 2-5 decode; slots 0 and 7 (sparse) verify
            sparse = next(group for group in step.groups if group.gather.shape == (2, 6))
            assert torch.equal(sparse.slots, torch.tensor([0, 7]))


@pytest.mark.parametrize("family", ["tiny_qwen3", "tiny_gemma3"])
def test_decoding_and_verifying_runs_attend_together_where_padding_is_cheap(request, family):
    """Where one group pads to at most ``MERGE_PADDING`` times the real rows, decoding and
    verifying runs attend as one group (a second attention call per layer costs more than a
    few padded rows); the logits stay the plain forward's, the padded rows masked off."""
    from dspark.targets.flat import MERGE_PADDING

    target = TargetAdapter(request.getfixturevalue(family))
    store = KVStore.for_target(target, num_slots=4, capacity=64)
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(3, 128, (n,), generator=g) for n in (30, 24, 26, 28)]
    refs = [reference_logits(target, s) for s in seqs]
    done, slots = [0] * 4, [0, 1, 2, 3]
    # a prefill, then steps in which two requests verify 3 tokens beside two decoding, then one 12
    for chunk in ([12, 10, 11, 12], [3, 1, 3, 1], [1, 1, 1, 1], [1, 12, 1, 1]):
        runs = [Run(slot=slots[r], start=done[r], length=n) for r, n in enumerate(chunk)]
        step = FlatStep.build(store, runs)
        out, who = run_step(target, store, seqs, done, chunk, slots)
        for i, (r, p) in enumerate(who):
            torch.testing.assert_close(out.logits[i], refs[r][p], atol=2e-5, rtol=1e-4)
        shapes = sorted(tuple(group.gather.shape) for group in step.groups)
        if chunk == [3, 1, 3, 1]:  # 12 padded rows for 8 real ones: one group
            assert shapes == [(4, 3)]
        if chunk == [1, 12, 1, 1]:  # 48 padded rows for 15 real ones: apart
            assert MERGE_PADDING * 15 < 4 * 12 and shapes == [(1, 12), (4, 1)]
        if chunk == [3, 1, 3, 1]:
            assert MERGE_PADDING * 8 >= 4 * 3


def test_features_equal_the_adapters(tiny_qwen3):
    target = TargetAdapter(tiny_qwen3)
    store = KVStore.for_target(target, num_slots=2, capacity=32)
    seqs = [torch.randint(3, 128, (20,)), torch.randint(3, 128, (9,))]
    done = [0, 0]
    out, who = run_step(target, store, seqs, done, [20, 9], [0, 1], features=True)
    for r, seq in enumerate(seqs):
        ref = target.forward(seq.unsqueeze(0), TargetCache()).features[0]  # [T, L, H]
        rows = [i for i, (rr, _) in enumerate(who) if rr == r]
        torch.testing.assert_close(out.features[rows], ref, atol=2e-5, rtol=1e-4)


def test_rollback_and_slot_moves(tiny_qwen3):
    """Rejected drafts left in the store are never read; a moved slot keeps its request's KV."""
    target = TargetAdapter(tiny_qwen3)
    kv = KVMemory(KVStore.for_target(target, num_slots=3, capacity=48))
    g = torch.Generator().manual_seed(1)
    seqs = {rid: torch.randint(3, 128, (30,), generator=g) for rid in (10, 11, 12)}
    refs = {rid: reference_logits(target, s) for rid, s in seqs.items()}
    for rid in seqs:
        kv.allocate(rid)

    def forward(rid_tokens: dict[int, torch.Tensor]):
        runs, ids = [], []
        for rid, toks in rid_tokens.items():
            runs.append(Run(kv.slot(rid), kv.length(rid), len(toks)))
            ids.append(toks)
        out = flat_forward(target, kv.store, torch.cat(ids), runs, logits_at=torch.arange(sum(map(len, ids))))
        return out.logits.split([len(t) for t in ids])

    for rid, s in seqs.items():  # prefill 10 tokens each
        forward({rid: s[:10]})
        kv.set_length(rid, 10)
    # A round with 5 wrong drafts for request 11: verify, then roll back to anchor + 0 accepted.
    wrong = torch.cat([seqs[11][10:11], torch.randint(3, 128, (5,), generator=g)])
    forward({11: wrong, 12: seqs[12][10:13]})
    kv.set_length(11, 11)
    kv.set_length(12, 13)
    kv.release(10)  # slot of 10 freed: request 12 moves from slot 2 into slot 0
    assert kv.slot(12) == 0 and kv.slot(11) == 1 and kv.num_free == 1
    logits = forward({11: seqs[11][11:16], 12: seqs[12][13:15]})
    torch.testing.assert_close(logits[0], refs[11][11:16], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(logits[1], refs[12][13:15], atol=2e-5, rtol=1e-4)


def test_unsupported_and_oversized(tiny_gemma, tiny_qwen3):
    assert isinstance(tiny_gemma, Gemma2ForCausalLM)
    with pytest.raises(UnsupportedTargetError, match="softcapping"):
        KVStore.for_target(TargetAdapter(tiny_gemma), num_slots=1, capacity=8)
    target = TargetAdapter(tiny_qwen3)
    store = KVStore.for_target(target, num_slots=1, capacity=8)
    with pytest.raises(ValueError, match="capacity"):
        flat_forward(
            target, store, torch.ones(4, dtype=torch.long), [Run(0, 6, 4)], logits_at=torch.arange(4)
        )
    # the model is back on its own attention afterwards
    assert target.model.config._attn_implementation != "dspark_flat"
