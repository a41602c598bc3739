"""Lossless verification of a token tree (DESIGN §3 generalised from a chain to a tree).

A *token tree* hangs a request's drafts under its anchor (the root): every node is a
draft token whose parent is another node or the anchor. The target scores every node
in one forward (each node sees the context and its ancestors, :func:`ancestor_mask`),
which gives at each node ``n`` the target distribution ``p_t(· | path to n)`` of the
token after it. Verification walks down from the root:

- at the current node, its children are tried **in order** against the current
  residual ``q`` (``q = p_t`` at first). A *sampled* first child ``x ~ p_d`` (the
  chain's draft, at T > 0) is the chain's test: accepted with probability
  ``min(1, q(x) / p_d(x))``, else ``q = norm(max(0, q - p_d))``. Every other child is a
  one-hot draft: accepted with probability ``q(x)``; if rejected, ``x`` is removed from
  ``q`` and ``q`` renormalised (:func:`one_hot_residual`);
- an accepted child becomes the current node and the walk goes on from it;
- when every child was rejected (or the node has none) the round emits one token drawn
  from ``q``: the **recovered** token after a rejection, the **bonus** token at a leaf.

Why this is lossless: with one-hot children ``x_1..x_m`` tried in order against ``q``,
``x_i`` is emitted with probability ``Π_{j<i} (1 - q_{j-1}(x_j)) · q_{i-1}(x_i) = q(x_i)``
(each removal renormalises by exactly the mass that was rejected), and any other token
``y`` with ``(1 - Σ_i q(x_i)) · q(y) / (1 - Σ_i q(x_i)) = q(y)``: the node emits a token
distributed as ``q``. With ``q = p_t`` that is the target; after a rejected sampled
child, ``q`` is the chain's residual, and the chain's argument (DESIGN §3) gives ``p_t``
again. This holds at any temperature for a tree fixed before the target is consulted,
provided whether a sampled child is verified does not depend on its own token (the
budget's ranking, ``scheduler/tree_budget.py``, reads nothing of it). Greedy requests
accept the child equal to the target's argmax, then emit the argmax.

A chain of K drafts is the tree whose node ``i`` has parent ``i - 1``; :func:`verify_tree`
then returns exactly what :func:`dspark.sampling.rejection.verify` returns, sample for
sample, for sampled and for one-hot drafts: node ``i`` is tested with uniform ``i`` and the next token
uses uniform ``N_r`` (of ``N_r + 1`` drawn per request, as the chain draws ``ℓ + 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dspark.sampling.argmax import greedy_tokens
from dspark.sampling.rejection import (
    Generators,
    accept_test,
    draw_uniforms,
    one_hot_residual,
    residual_distribution,
    sample_inverse_cdf,
)

ROOT = -1  # the parent index of a child of the anchor


@dataclass(frozen=True, kw_only=True)
class TreeConfig:
    """How a drafter grows a token tree (``drafters/tree.py``): ``widths[d]`` children per
    node at depth d (the last width repeats up to the block size when ``depth`` is None),
    ``frontier`` nodes expanded per depth (None: all of them; greedy trees only)."""

    widths: tuple[int, ...] = (4, 2, 2, 1)
    depth: int | None = None  # None: the drafter's block size
    frontier: int | None = 8

    def __post_init__(self) -> None:
        if not self.widths or min(self.widths) < 1:
            raise ValueError(f"tree widths must be >= 1, got {self.widths}")
        if self.frontier is not None and self.frontier < 1:
            raise ValueError(f"tree frontier must be >= 1, got {self.frontier}")

    def width(self, d: int) -> int:
        return self.widths[min(d, len(self.widths) - 1)]


@dataclass(frozen=True)
class TreeBlock:
    """R requests' token trees, padded to N nodes.

    Request r's nodes are ``0..sizes[r]-1``, in topological order (``parents[r, i] < i``)
    with siblings in the order verification tries them (most likely first). Padding nodes
    (``i >= sizes[r]``) hold any token and parent :data:`ROOT`; nothing reads them.
    """

    tokens: Tensor  # [R, N] long
    parents: Tensor  # [R, N] long, ROOT or a smaller node index
    sizes: Tensor  # [R] long, 0 <= sizes[r] <= N
    confidences: Tensor | None = None  # [R, N] predicted P(node accepted | parent reached)
    # [R, N, V] the distribution a *sampled* node was drawn from (a first child only);
    # None: every node is one-hot. Rows of one-hot nodes are all zero.
    draft_probs: Tensor | None = None

    def __post_init__(self) -> None:
        R, N = self.tokens.shape
        assert self.parents.shape == (R, N), f"parents {tuple(self.parents.shape)} != {(R, N)}"
        assert self.sizes.shape == (R,), f"sizes {tuple(self.sizes.shape)} != ({R},)"
        assert self.confidences is None or self.confidences.shape == (R, N)
        assert self.draft_probs is None or self.draft_probs.shape[:2] == (R, N)
        valid = self.valid()  # [R, N]
        index = torch.arange(N, device=self.parents.device)
        ok = (self.parents >= ROOT) & (self.parents < index)  # [R, N]
        assert bool((ok | ~valid).all()), "parents must precede their children"

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    def sampled(self) -> Tensor:
        """``[R, N]`` bool: nodes drawn from a distribution (``draft_probs``), not one-hot."""
        if self.draft_probs is None:
            return torch.zeros_like(self.valid())
        return (self.draft_probs.sum(-1) > 0) & self.valid()

    def valid(self) -> Tensor:
        """``[R, N]`` bool: the real nodes."""
        return torch.arange(self.num_nodes, device=self.sizes.device) < self.sizes.unsqueeze(-1)

    def depths(self) -> Tensor:
        """``[R, N]`` long: 1 for a child of the anchor, its parent's depth + 1 below."""
        depth = torch.zeros_like(self.parents)
        for i in range(self.num_nodes):  # parents precede children: one pass suffices
            p = self.parents[:, i]
            parent_depth = depth.gather(1, p.clamp_min(0).unsqueeze(1)).squeeze(1)  # [R]
            depth[:, i] = 1 + torch.where(p >= 0, parent_depth, 0)
        return torch.where(self.valid(), depth, 0)

    def ancestors(self) -> Tensor:
        """``[R, N, N]`` bool: ``[r, i, j]`` iff node j is node i or one of its ancestors."""
        R, N = self.parents.shape
        valid = self.valid()
        anc = torch.eye(N, dtype=torch.bool, device=self.parents.device).expand(R, N, N).clone()
        up = torch.where(valid, self.parents, ROOT)  # [R, N]: each node's ancestor d levels up
        rows = torch.arange(R, device=up.device).unsqueeze(-1).expand(R, N)
        cols = torch.arange(N, device=up.device).expand(R, N)
        while bool((up >= 0).any()):  # one pass per level of the deepest node
            anc[rows, cols, up.clamp_min(0)] |= up >= 0
            up = torch.where(up >= 0, self.parents.gather(1, up.clamp_min(0)), ROOT)
        return anc & valid.unsqueeze(-1) & valid.unsqueeze(1)

    def survival(self) -> Tensor:
        """Path survival ``[R, N]`` fp64: the product of the confidences from the root to the node."""
        assert self.confidences is not None, "survival needs confidences"
        log_c = self.confidences.double().clamp(1e-300, 1.0).log()  # [R, N]
        log_a = (self.ancestors().double() * log_c.unsqueeze(1)).sum(-1)  # [R, N]
        return torch.where(self.valid(), log_a.exp(), 0.0)

    def children(self) -> Tensor:
        """``[R, N + 1, W]`` long: row ``1 + n`` lists node n's children in try order (row 0:
        the anchor's), padded with -1; ``W`` is the largest number of children of a node."""
        R, N = self.parents.shape
        device = self.parents.device
        owner = torch.where(self.valid(), self.parents + 1, N + 1)  # [R, N]: row of the parent; N+1 = none
        # The rank of node i among its siblings: siblings before it with the same parent.
        same = owner.unsqueeze(-1) == owner.unsqueeze(1)  # [R, N, N]
        before = torch.ones(N, N, dtype=torch.bool, device=device).tril(-1)  # [i, j]: j < i
        rank = (same & before).sum(-1)  # [R, N]
        W = int(torch.where(self.valid(), rank + 1, 0).max()) if N > 0 else 0
        rank = torch.where(self.valid(), rank, 0)  # padding nodes all land in the dropped row N + 1
        table = torch.full((R, N + 2, max(W, 1)), -1, dtype=torch.long, device=device)
        r = torch.arange(R, device=device).unsqueeze(-1).expand(R, N)
        table[r, owner, rank] = torch.arange(N, device=device).expand(R, N)
        return table[:, : N + 1, :W]

    def select(self, keep: Tensor) -> TreeBlock:
        """The subtree of the nodes in ``keep [R, N]`` (closed under parents), renumbered in order."""
        keep = keep & self.valid()
        parents_kept = torch.where(self.parents >= 0, keep.gather(1, self.parents.clamp_min(0)), True)
        assert bool((parents_kept | ~keep).all()), "a kept node's parent must be kept"
        R, N = keep.shape
        new_index = keep.long().cumsum(-1) - 1  # [R, N]: position among the kept
        sizes = keep.sum(-1)  # [R]
        M = int(sizes.max()) if R else 0
        order = torch.sort((~keep).long(), dim=-1, stable=True).indices[:, :M]  # [R, M] kept first
        tokens = self.tokens.gather(1, order)
        parents = self.parents.gather(1, order)
        parents = torch.where(parents >= 0, new_index.gather(1, parents.clamp_min(0)), ROOT)
        conf = None if self.confidences is None else self.confidences.gather(1, order)
        probs = None
        if self.draft_probs is not None:
            probs = self.draft_probs.gather(1, order.unsqueeze(-1).expand(R, M, self.draft_probs.shape[-1]))
        valid = torch.arange(M, device=keep.device) < sizes.unsqueeze(-1)  # [R, M]
        if probs is not None:
            probs = probs * valid.unsqueeze(-1)
        return TreeBlock(torch.where(valid, tokens, 0), torch.where(valid, parents, ROOT), sizes, conf, probs)

    @classmethod
    def chain(
        cls,
        tokens: Tensor,
        lengths: Tensor,
        confidences: Tensor | None = None,
        draft_probs: Tensor | None = None,
    ) -> TreeBlock:
        """Chains ``tokens [R, K]`` of ``lengths [R]`` as trees: node i's parent is i - 1;
        ``draft_probs [R, K, V]`` when the drafts were sampled (None: one-hot)."""
        R, K = tokens.shape
        parents = (torch.arange(K, device=tokens.device) - 1).expand(R, K).clone()
        return cls(tokens, parents, lengths.clone(), confidences, draft_probs)


@dataclass(frozen=True)
class TreeVerifyOutput:
    """The outcome of verifying R token trees."""

    paths: list[list[int]]  # per request, the accepted nodes from the root down
    next_tokens: Tensor  # [R] long: the recovered token, or the bonus token at a leaf

    @property
    def num_accepted(self) -> Tensor:
        """``[R]`` long: accepted drafts (the depth the walk reached)."""
        return torch.tensor([len(p) for p in self.paths], dtype=torch.long)

    def emitted(self, tree: TreeBlock, r: int) -> list[int]:
        """Tokens request ``r`` emits: its accepted path's tokens, then the next token."""
        return tree.tokens[r, self.paths[r]].tolist() + [int(self.next_tokens[r])]


def verify_tree(
    tree: TreeBlock,
    target_probs: Tensor,
    *,
    greedy: Tensor | None = None,
    generators: Generators = None,
) -> TreeVerifyOutput:
    """Verify R token trees against the target (module docstring).

    Args:
        tree: the drafts; node i of request r is row ``1 + i`` of its target distributions.
        target_probs: ``[R, N + 1, V]`` processed target distributions: row 0 at the anchor
            (the distribution of the first draft), row ``1 + i`` after node i.
        greedy: ``[R]`` bool, requests with temperature 0.
        generators: one shared generator, or one per request (``rejection.draw_uniforms``).
    """
    R, N = tree.tokens.shape
    V = target_probs.shape[-1]
    device = tree.tokens.device
    assert target_probs.shape == (R, N + 1, V), f"target_probs {tuple(target_probs.shape)} != {(R, N + 1, V)}"
    greedy = torch.zeros(R, dtype=torch.bool, device=device) if greedy is None else greedy.to(device)
    assert greedy.shape == (R,), f"greedy {tuple(greedy.shape)} != ({R},)"
    rows = torch.arange(R, device=device)
    children = tree.children()  # [R, N + 1, W]
    choice = greedy_tokens(target_probs)  # [R, N + 1]: the greedy rule's target token per row
    if bool(greedy.all()):  # no uniforms drawn, as rejection.verify_greedy
        return verify_tree_greedy(tree, choice)
    sampled = tree.sampled() & ~greedy.unsqueeze(-1)  # [R, N]
    u_accept, u_next = draw_uniforms(tree.sizes, N, generators)  # [R, N], [R]

    at = torch.zeros(R, dtype=torch.long, device=device)  # [R] current row: 0 = anchor, 1 + n = node n
    walking = torch.ones(R, dtype=torch.bool, device=device)  # [R] still descending
    paths: list[list[int]] = [[] for _ in range(R)]
    q = target_probs[:, 0].float()  # [R, V] the current residual
    while bool(walking.any()):
        moved = torch.zeros(R, dtype=torch.bool, device=device)  # [R] a child was accepted
        for w in range(children.shape[-1]):
            child = children[rows, at, w]  # [R] node index or -1
            trying = walking & ~moved & (child >= 0)  # [R]
            if not bool(trying.any()):
                break
            c = child.clamp_min(0)
            x = tree.tokens[rows, c].unsqueeze(-1)  # [R, 1]
            q_x = q.gather(-1, x).squeeze(-1).double()  # [R]
            drawn = sampled[rows, c] & trying  # [R]: tested as the chain tests a sampled draft
            p_d = tree.draft_probs[rows, c].float() if bool(drawn.any()) else None  # [R, V]
            p_d_x = p_d.gather(-1, x).squeeze(-1).double() if p_d is not None else torch.ones_like(q_x)
            p_d_x = torch.where(drawn, p_d_x, 1.0)  # one-hot: p_d(x) = 1
            accept = torch.where(
                greedy, x.squeeze(-1) == choice[rows, at], accept_test(q_x, p_d_x, u_accept[rows, c])
            )
            accept = accept & trying
            rejected = trying & ~accept & ~greedy
            residual = one_hot_residual(q, x)  # remove x, renormalise
            if p_d is not None:  # a rejected sampled child leaves the chain's residual norm(max(0, q - p_d))
                residual = torch.where(drawn.unsqueeze(-1), residual_distribution(q, p_d), residual)
            q = torch.where(rejected.unsqueeze(-1), residual, q)
            moved |= accept
            at = torch.where(accept, c + 1, at)
            for r in accept.nonzero().flatten().tolist():
                paths[r].append(int(c[r]))
        # A node reached by an accepted child starts over from its own target row.
        q = torch.where(moved.unsqueeze(-1), target_probs[rows, at].float(), q)
        walking = walking & moved  # a row that stopped keeps its residual for the next token
    next_tokens = sample_inverse_cdf(q, u_next)  # [R]: recovered from the residual, or bonus
    next_tokens = torch.where(greedy, choice[rows, at], next_tokens)
    return TreeVerifyOutput(paths=paths, next_tokens=next_tokens)


def verify_tree_greedy(tree: TreeBlock, choice: Tensor) -> TreeVerifyOutput:
    """:func:`verify_tree` when every request is greedy, from the target's greedy tokens
    ``choice [R, N + 1]``: follow the child equal to the choice while there is one, then
    emit the choice. A walk over host lists: a handful of nodes, no tensor op per node."""
    children, tokens, choice_rows = tree.children().tolist(), tree.tokens.tolist(), choice.tolist()
    paths, next_tokens = [], []
    for kids, toks, want in zip(children, tokens, choice_rows):
        path, at = [], 0
        while True:
            hit = next((c for c in kids[at] if c >= 0 and toks[c] == want[at]), None)
            if hit is None:
                break
            path.append(hit)
            at = hit + 1
        paths.append(path)
        next_tokens.append(want[at])
    return TreeVerifyOutput(paths=paths, next_tokens=torch.tensor(next_tokens, device=choice.device))
