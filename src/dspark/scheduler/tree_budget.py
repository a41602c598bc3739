"""Which tree nodes to verify this step: paper Algorithm 1 over tree nodes (DESIGN §9).

Algorithm 1 ranks a chain's prefixes by survival ``a_{r,j} = Π_{i<=j} c_{r,i}`` and
admits them while the expected throughput ``Θ = τ* · SPS(B)`` strictly rises, with
``τ* = R + Σ a`` over the admitted candidates and ``B = R + base + admitted``. Over a
tree the candidates are the nodes and ``a`` is a node's *path survival* (the product of
the conditional confidences from the root down to it): the expected number of accepted
drafts is still ``Σ a`` over the verified nodes, because a node is accepted only if
every node above it is. A child's survival never exceeds its parent's (``c <= 1``) and a
parent precedes its children in node order, so ranking by survival with ties in node
order admits a node only with its parent. A chain is the tree of width 1, where this is
:func:`dspark.scheduler.policies.prefix_lengths` exactly (pinned by a test).

Tree drafts are one-hot and fixed before the target is consulted, so any rule over their
survivals (this one, the global search, a fixed node count) keeps verification lossless
(``sampling/tree.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dspark.scheduler.policies import _throughputs
from dspark.scheduler.profile import SpsTable


def ranked_nodes(survival: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Real nodes with ``a > 0`` by descending survival: requests ``[n]``, nodes ``[n]``, ``a [n]``.

    Ties keep node order across the batch (a stable sort over a node-major layout), so
    every parent comes before its children.
    """
    R, N = survival.shape
    a = survival.double().cpu()  # [R, N]
    ok = valid.cpu() & (a > 0)  # [R, N]
    node = torch.arange(N).expand(R, N)
    req = torch.arange(R).unsqueeze(-1).expand(R, N)
    a, node, req = a.T[ok.T], node.T[ok.T], req.T[ok.T]  # node-major flattening
    order = torch.sort(a, descending=True, stable=True).indices
    return req[order], node[order], a[order]


def _keep(requests: Tensor, nodes: Tensor, admitted: int, shape: tuple[int, int]) -> Tensor:
    keep = torch.zeros(shape, dtype=torch.bool)  # [R, N]
    keep[requests[:admitted], nodes[:admitted]] = True
    return keep


def tree_budget(survival: Tensor, valid: Tensor, sps: SpsTable, *, base_tokens: int = 0) -> Tensor:
    """Algorithm 1 with early stopping over tree nodes: ``keep [R, N]`` bool, closed under parents.

    ``survival [R, N]`` is each node's path survival, ``valid [R, N]`` the real nodes;
    ``base_tokens`` are tokens of the same forward that are not speculation.
    """
    R = survival.shape[0]
    requests, nodes, a = ranked_nodes(survival, valid)
    theta = _throughputs(a, R, base_tokens, sps)  # [n + 1]: Θ after admitting the first i nodes
    rising = (theta[1:] > theta[:-1]).long()
    admitted = int(rising.cumprod(0).sum())  # stop at the first node that does not raise Θ
    return _keep(requests, nodes, admitted, tuple(survival.shape))


def top_nodes(survival: Tensor, valid: Tensor, n: int) -> Tensor:
    """Each request's ``n`` nodes of highest survival (``--tree-nodes n``): ``keep [R, N]``.

    ``n = γ`` verifies as many drafts per round as a chain of γ: a tree and a chain compared
    at the same verification budget.
    """
    R, N = survival.shape
    keep = torch.zeros(R, N, dtype=torch.bool)
    for r in range(R):
        _, nodes, _ = ranked_nodes(survival[r : r + 1], valid[r : r + 1])
        keep[r, nodes[:n]] = True
    return keep
