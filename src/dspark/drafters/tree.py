"""Token trees from one parallel backbone forward: DSpark (Markov-biased children) and DFlash.

A DFlash backbone's hidden state of slot k does not depend on the drafted tokens (DESIGN
§5.1), and DSpark's Markov head biases slot k by the previous token alone (paper Eq. 5).
So the children of *any* node at depth d are scored from the same ``h_d`` and base logits
``U_d``, plus the cheap low-rank bias of the node's own token: a whole tree costs one
backbone forward and one ``[n, r] x [r, N]`` product per depth.

- **DSpark**: the children of a node with token ``x`` are the top ``k_d`` tokens of
  ``softmax(U_d + W_1[x] W_2)`` (Eq. 4 with the Markov bias, Eq. 5). The confidence head
  reads ``[h_d ; W_1[x]]`` (Eq. 7, STS-scaled as in the chain) and predicts the
  acceptance of the node's *first* child; the i-th child gets ``c · p_(i) / p_(1)``, the
  head's calibration carried to the siblings by the draft distribution's ratios, never above
  the first child's (so a sibling never ranks before it). (DESIGN §9.1 says why this rule).
- **DFlash** (no Markov head, no confidence head): the children of every node at depth d
  are the top ``k_d`` of ``softmax(U_d)``, each with confidence ``p_d(x_i)``.

At T > 0 the first child of every node is *sampled* from the processed ``p_d`` of the
node's slot, exactly as the chain draws its draft (so a width-1 tree is the chain), and
the siblings are the most likely other tokens, one-hot. The i-th child's confidence reads
the i-th largest probability ``p_(i)`` whichever token was drawn: nothing in the tree's
shape or confidences depends on a sampled token except its own descendants.

A node's *path survival* is the product of the confidences from the root down to it
(:meth:`TreeBlock.survival`). The tree is grown breadth first; with ``frontier`` set,
only that many nodes of a depth (the highest survival) get children (EAGLE-2's
expansion) — for one-hot trees only (greedy): which nodes are expanded depends on the
confidences of the nodes below a sampled one, and through them whether that sampled
node ranks inside the budget, which would bias it (paper Appendix A). Sampled trees
are expanded in full; the budget then ranks a sampled node only after nodes none of
which descend from it (``scheduler/tree_budget.py``), and verification is lossless
(``sampling/tree.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from dspark.drafters.draft_vocab import draft_to_target
from dspark.drafters.request_state import sample_tokens
from dspark.protocols import SamplingParams
from dspark.sampling.probs import batch_probs
from dspark.sampling.tree import ROOT, TreeBlock, TreeConfig


@dataclass(frozen=True)
class SlotScores:
    """What one backbone forward gives the tree builder for R requests.

    ``bias(prev [R, n]) -> [R, n, N]`` is the sequential head's bias for children of nodes
    with tokens ``prev`` (target ids); ``confidence(d, prev [R, n]) -> [R, n]`` the head's
    STS-scaled ``c`` at slot d. Both None for a backbone alone (DFlash).
    """

    base: Tensor  # [R, K, N] base logits U_k over the draft vocabulary
    anchors: Tensor  # [R] long, x_0
    bias: Callable[[Tensor], Tensor] | None = None
    confidence: Callable[[int, Tensor], Tensor] | None = None
    draft_ids: Tensor | None = None  # [N] target id of each draft id; None: the full vocabulary
    # Sampled first children (T > 0): each request's params and the drafter's generators.
    sampling: list[SamplingParams] | None = None  # None: every request greedy (one-hot trees)
    generators: list[torch.Generator | None] | None = None
    vocab_size: int | None = None  # V, for the sampled children's [V]-wide p_d

    @property
    def samples(self) -> bool:
        return self.sampling is not None and not all(p.greedy for p in self.sampling)


@torch.no_grad()
def build_trees(slots: SlotScores, config: TreeConfig) -> TreeBlock:
    """Grow every request's tree breadth first from its anchor (module docstring)."""
    R, K, _ = slots.base.shape
    depth = K if config.depth is None else min(K, config.depth)
    frontier = None if slots.samples else config.frontier
    device = slots.base.device
    tokens, parents, confs, probs = [], [], [], []
    # The frontier: nodes of the current depth that get children.
    prev = slots.anchors.view(R, 1)  # [R, n] tokens
    where = torch.full((R, 1), ROOT, dtype=torch.long, device=device)  # [R, n] node indices
    alive = torch.ones(R, 1, dtype=torch.float64, device=device)  # [R, n] path survival
    count = 0
    for d in range(depth):
        k, n = config.width(d), prev.shape[1]
        logits = slots.base[:, d].unsqueeze(1).float().expand(R, n, -1)  # [R, n, N]
        if slots.bias is not None:
            logits = logits + slots.bias(prev).float()  # U_d + W_1[x] W_2 (Eq. 4-5)
        ids, p_kids, rows = _children(logits, k, slots)  # [R, n, k] draft ids, [R, n, k], [R, n, k, V]
        child_tokens = ids if slots.draft_ids is None else slots.draft_ids[ids]  # target ids
        c = p_kids  # a backbone alone: the draft probability p_(i)
        if slots.confidence is not None:  # the head's c for the first child, scaled by p_(i) / p_(1)
            c_head = slots.confidence(d, prev).double().clamp(0.0, 1.0)  # [R, n]
            c = c_head.unsqueeze(-1) * p_kids / p_kids[..., :1]  # [R, n, k]: never above the first child's
        tokens.append(child_tokens.reshape(R, n * k))  # parent-major, siblings in try order
        parents.append(where.unsqueeze(-1).expand(R, n, k).reshape(R, n * k))
        confs.append(c.reshape(R, n * k))
        if rows is not None:
            probs.append(rows.reshape(R, n * k, -1))
        survival = (alive.unsqueeze(-1) * c).reshape(R, n * k)  # [R, n k]
        index = count + torch.arange(n * k, device=device).expand(R, n * k)
        count += n * k
        keep = n * k if frontier is None else min(frontier, n * k)
        # The best `keep` children expand next; back in index order so siblings stay in order.
        best = survival.topk(keep, dim=-1).indices.sort(dim=-1).values  # [R, keep]
        prev = tokens[-1].gather(1, best)
        where = index.gather(1, best)
        alive = survival.gather(1, best)
    return TreeBlock(
        torch.cat(tokens, dim=1),
        torch.cat(parents, dim=1),
        torch.full((R,), count, dtype=torch.long, device=device),
        torch.cat(confs, dim=1),
        torch.cat(probs, dim=1) if probs else None,
    )


def _children(logits: Tensor, k: int, slots: SlotScores) -> tuple[Tensor, Tensor, Tensor | None]:
    """The k children of each of n nodes from their logits ``[R, n, N]``.

    Returns draft ids ``[R, n, k]``, the sorted top-k probabilities ``p_(1..k)`` ``[R, n, k]``
    fp64 (the confidences' source, the same whichever token was drawn) and, when sampling,
    ``p_d [R, n, k, V]``: the first child's processed distribution, zero rows for the
    one-hot siblings (None when every request is greedy).
    """
    R, n, N = logits.shape
    top = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)  # [R, n, k]
    p_sorted = top.values.exp().double()
    if not slots.samples:
        return top.indices, p_sorted, None
    p_d = batch_probs(logits, slots.sampling)  # [R, n, N]: the chain's processing (probs.py)
    first = sample_tokens(p_d, slots.sampling, slots.generators)  # [R, n]: greedy rows take the argmax
    others = logits.scatter(-1, first.unsqueeze(-1), float("-inf")).topk(k - 1, dim=-1).indices
    ids = torch.cat([first.unsqueeze(-1), others], dim=-1)  # [R, n, k]
    _, p_first = draft_to_target(first, p_d, slots.draft_ids, slots.vocab_size)  # [R, n, V]
    rows = p_first.new_zeros(R, n, k, p_first.shape[-1])
    greedy = torch.tensor([p.greedy for p in slots.sampling], device=logits.device)  # [R]
    rows[:, :, 0] = p_first * ~greedy.view(R, 1, 1)  # greedy requests' children stay one-hot
    return ids, p_sorted, rows
