"""Inference = training, and incremental = from scratch.

- The context K/V cache extended round by round gives the draft distributions that a
  fresh state (everything recomputed) gives.
- ``propose`` and ``forward_train`` compute the same distributions: a block drafted at
  anchor a equals the training block at anchor a when the training sequence continues
  with the drafted tokens (teacher forcing then feeds exactly the sampled tokens). This
  pins positions, RoPE, masks, the Markov/RNN recurrence and Eagle3's training-time test.
"""

from __future__ import annotations

import torch

from dspark.protocols import SamplingParams

from .builders import BLOCK, make_batch, make_state, prompt

PARAMS = SamplingParams(temperature=1.0, seed=11)


def test_incremental_context_cache_equals_recompute(target, drafter):
    ids = prompt(30)
    state = make_state(target, ids[:8])
    drafter.propose([state], BLOCK, [PARAMS])
    for end in (10, 11, 15, 19):  # rounds committing 2, 1, 4 and 4 tokens
        new = ids[len(state.token_ids) : end]
        state.token_ids.extend(new)
        state.features = make_state(target, state.token_ids).features  # the target's features of the prefix
        drafter.update(state, len(new) - 1, None)
        state.drafter_cache.generator = torch.Generator().manual_seed(PARAMS.seed)
        incremental = drafter.propose([state], BLOCK, [PARAMS])
        fresh = drafter.propose([make_state(target, state.token_ids)], BLOCK, [PARAMS])
        torch.testing.assert_close(incremental.probs, fresh.probs, atol=1e-5, rtol=1e-5)
        assert torch.equal(incremental.tokens, fresh.tokens)


def test_propose_equals_forward_train(target, drafter):
    ids = prompt(12)
    block = drafter.propose([make_state(target, ids)], BLOCK, [PARAMS])
    seq = torch.tensor([ids + block.tokens[0].tolist()])  # [1, T]: the drafts as ground truth
    anchor = len(ids) - 1
    loss_mask = torch.zeros_like(seq, dtype=torch.bool)
    loss_mask[0, anchor:] = True
    batch = make_batch(target, seq, loss_mask, anchors=torch.tensor([[2, anchor]]))
    with torch.no_grad():
        out = drafter.forward_train(batch)
    assert out.valid[0, 1].all() and torch.equal(out.labels[0, 1], block.tokens[0])
    train_probs = torch.softmax(out.logits[0, 1], dim=-1)  # [K, V]
    torch.testing.assert_close(train_probs, block.probs[0], atol=1e-5, rtol=1e-4)
    if block.confidences is not None:
        torch.testing.assert_close(out.confidences[0, 1], block.confidences[0], atol=1e-5, rtol=1e-4)
