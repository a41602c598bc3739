"""The packed training forward equals its definition: every block computed alone (DESIGN §6, issue 16).

DFlash/DSpark train on all blocks of a micro-batch at once, packed into one sequence
with padding dropped and attention scored only where a block may look. The oracle here
computes each block by itself — its context is exactly the fused features before its
anchor, its queries its own K slots, no mask at all — so a packing or masking mistake
(a block seeing its successor's context, another row, padding, another block) moves the
logits, the loss and the gradients beyond float noise.
"""

from __future__ import annotations

import pytest
import torch

from dspark.drafters.attention import PackedBlockMask, attend, attend_packed_blocks
from dspark.drafters.blocks import PAD_ANCHOR, batch_layout
from dspark.drafters.common import draft_rope
from dspark.protocols import TrainBatch, TrainOutput
from dspark.targets import TargetAdapter
from dspark.training.objective import compute_loss
from tests.unit.drafters.builders import DRAFTERS, build, make_batch, prompt


def two_rows(target: TargetAdapter):
    """Rows of 20 and 13 real tokens (the second right-padded), anchors padded with -1."""
    ids = torch.tensor([prompt(20, seed=1), prompt(13, seed=2) + [0] * 7])
    loss_mask = torch.zeros(2, 20, dtype=torch.bool)
    loss_mask[0, 3:] = True
    loss_mask[1, 5:13] = True
    anchors = torch.tensor([[3, 7, 8, 15], [5, 10, PAD_ANCHOR, PAD_ANCHOR]])
    return make_batch(target, ids, loss_mask, anchors=anchors)


def oracle_output(drafter, batch) -> TrainOutput:
    """Block by block, each over its own context (features before its anchor) and slots only."""
    layout = batch_layout(batch, drafter.block_size)
    net = drafter.backbone  # DFlash and DSpark hold one
    hidden, rows, positions, labels, valid = [], [], [], [], []
    for b, a in (layout.anchors >= 0).nonzero().tolist():
        anchor = int(layout.anchors[b, a])
        h_ctx = net.context_features(batch.features[b : b + 1, :anchor])  # [1, anchor, H]
        cos_c, sin_c = draft_rope(net.dims, torch.arange(anchor).unsqueeze(0))
        h = net.embed(net._block_inputs(batch.input_ids[b, anchor].view(1)))  # [1, K, H]
        cos_q, sin_q = draft_rope(net.dims, layout.positions[b, a].unsqueeze(0))
        for layer in drafter.layers:
            ctx_k, ctx_v = layer.context_kv(h_ctx, cos_c, sin_c)
            h = layer(h, cos_q, sin_q, ctx_k, ctx_v, None)
        hidden.append(drafter.norm(h)[0])
        rows.append(b)
        positions.append(layout.positions[b, a])
        labels.append(layout.labels[b, a])
        valid.append(layout.valid[b, a])
    h = torch.stack(hidden).unsqueeze(0)  # [1, N, K, H]
    rows_t, positions_t = torch.tensor(rows), torch.stack(positions)
    logits = net.logits(h)
    confidences = None
    if hasattr(drafter, "markov_head"):
        at = positions_t.clamp_max(batch.input_ids.shape[1] - 1)
        prev = batch.input_ids[rows_t.unsqueeze(-1), at].unsqueeze(0)
        emb = None
        if drafter.markov_head is not None:
            bias, emb = drafter.markov_head.teacher_forced(prev, h)
            logits = logits + bias.float()
        if drafter.confidence_head is not None:
            confidences = torch.sigmoid(drafter._confidence_logits(h, emb))
    T = batch.input_ids.shape[1]
    target_logits = net.logits(batch.target_hidden[rows_t.unsqueeze(-1), positions_t.clamp_max(T - 1)])
    return TrainOutput(
        logits=logits,
        labels=torch.stack(labels).unsqueeze(0),
        target_logits=target_logits.unsqueeze(0),
        valid=torch.stack(valid).unsqueeze(0),
        confidences=confidences,
    )


def loss_and_grads(drafter, out: TrainOutput):
    drafter.zero_grad(set_to_none=True)
    loss = compute_loss(out, drafter.config.objective).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


@pytest.mark.parametrize("name", ["dflash", "dspark_markov", "dspark_rnn"])
def test_packed_forward_equals_blocks_alone(target, name):
    drafter = build(name, target).train()
    batch = two_rows(target)
    packed = drafter.forward_train(batch)
    reference = oracle_output(drafter, batch)
    assert packed.logits.shape == reference.logits.shape == (1, 6, drafter.block_size, target.vocab_size)
    torch.testing.assert_close(packed.logits, reference.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.target_logits, reference.target_logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(packed.labels, reference.labels) and torch.equal(packed.valid, reference.valid)

    loss, grads = loss_and_grads(drafter, drafter.forward_train(batch))
    ref_loss, ref_grads = loss_and_grads(drafter, oracle_output(drafter, batch))
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert grads.keys() == ref_grads.keys() and len(grads) > 5
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], atol=1e-5, rtol=1e-4, msg=n)


def test_oracle_catches_a_block_that_sees_its_anchor(target, monkeypatch):
    """Negative control: a mask that also shows each block its anchor's own features is caught.

    (The packed context of a row ends at its last anchor, so every other block's anchor
    entry is there to leak.)
    """
    from dspark.drafters import blocks

    def leaky(self):
        same_row = self.ctx_rows.unsqueeze(0) == self.rows.unsqueeze(1)
        return same_row & (self.ctx_positions.unsqueeze(0) <= self.anchors.unsqueeze(1))

    drafter = build("dflash", target)
    batch = two_rows(target)
    with torch.no_grad():
        reference = oracle_output(drafter, batch).logits
        monkeypatch.setattr(blocks.PackedBlocks, "context_mask", leaky)
        leaked = drafter.forward_train(batch).logits
    assert not torch.allclose(leaked, reference, atol=1e-3)


def test_attend_packed_blocks_equals_dense_masked_sdpa():
    """The split softmax equals SDPA over [context ; every block] with the dense block mask."""
    g = torch.Generator().manual_seed(0)
    B, nh, nkv, N, K, C, hd = 1, 4, 2, 5, 3, 11, 8
    q = torch.randn(B, nh, N * K, hd, generator=g)
    ctx_k, ctx_v = torch.randn(B, nkv, C, hd, generator=g), torch.randn(B, nkv, C, hd, generator=g)
    k, v = torch.randn(B, nkv, N * K, hd, generator=g), torch.randn(B, nkv, N * K, hd, generator=g)
    visible = torch.rand(B, N, C, generator=g) < 0.6
    visible[:, 0] = False  # a block with no context at all still sees its own slots
    out = attend_packed_blocks(q, ctx_k, ctx_v, k, v, PackedBlockMask(visible, K))
    block = torch.arange(N).repeat_interleave(K)
    dense = torch.cat(
        [visible.repeat_interleave(K, dim=1), (block.unsqueeze(1) == block.unsqueeze(0)).unsqueeze(0)], dim=-1
    ).unsqueeze(1)  # [B, 1, N*K, C + N*K]
    expected = attend(q, torch.cat([ctx_k, k], 2), torch.cat([ctx_v, v], 2), dense)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def row_alone(batch, b: int, length: int):
    """Row ``b`` of ``batch`` as a batch of its own (its real tokens and real anchors only)."""
    anchors = batch.anchors[b : b + 1]
    return TrainBatch(
        input_ids=batch.input_ids[b : b + 1, :length],
        loss_mask=batch.loss_mask[b : b + 1, :length],
        features=batch.features[b : b + 1, :length],
        target_hidden=batch.target_hidden[b : b + 1, :length],
        anchors=anchors[:, anchors[0] >= 0],
    )


@pytest.mark.parametrize("name", DRAFTERS)
def test_outputs_do_not_depend_on_packing(target, name):
    """Two rows packed together give each block exactly what the row alone gives (issue 14)."""
    drafter = build(name, target)
    batch = two_rows(target)
    with torch.no_grad():
        packed = drafter.forward_train(batch)
        alone = [drafter.forward_train(row_alone(batch, b, n)) for b, n in ((0, 20), (1, 13))]
    # Past a row's end a slot reads padding (packed) or a clamped position (alone): never supervised.
    valid = packed.valid
    assert torch.equal(valid, torch.cat([a.valid for a in alone], dim=1)) and valid.sum() > 20
    logits = torch.cat([a.logits for a in alone], dim=1)
    torch.testing.assert_close(packed.logits[valid], logits[valid], atol=1e-5, rtol=1e-5)
    target_alone = torch.cat([a.target_logits for a in alone], 1)
    torch.testing.assert_close(packed.target_logits[valid], target_alone[valid])
    if packed.confidences is not None:
        alone_conf = torch.cat([a.confidences for a in alone], 1)
        torch.testing.assert_close(packed.confidences[valid], alone_conf[valid])
