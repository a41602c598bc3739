"""Batch-1 token-tree decoding: prefill → (tree draft → budget → tree verify → keep the path)*.

The tree counterpart of ``loop.py``'s reference loop, for one request on the adapter's
own KV cache:

1. **draft**: ``drafter.propose_tree``: one backbone forward grown into a tree
   (``drafters/tree.py``);
2. **budget**: the nodes to verify (:class:`TreeBudget`: a fixed number, Algorithm 1 over
   the SPS table, or all);
3. **verify**: one target forward over the anchor and every kept node with a tree
   attention mask (:func:`tree_attention`: each node sees the context and its
   ancestors, at position context + depth), then :func:`dspark.sampling.tree.verify_tree`;
4. **commit**: the cache keeps the anchor and the accepted path
   (:meth:`TargetCache.keep_rows`), every other node is rolled back; the drafter absorbs
   the path's features as after a chain round.

Rounds are counted as ``loop.py`` counts them; a round's ``RoundLog.proposed`` is the
number of tree nodes it verified.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dspark.decoding.loop import OnTokens, Transcript, start_request
from dspark.protocols import GenerationResult, SamplingParams, drafter_traits
from dspark.sampling import batch_probs
from dspark.sampling.tree import TreeBlock, TreeConfig, verify_tree
from dspark.scheduler.profile import SpsTable
from dspark.scheduler.tree_budget import top_nodes, tree_budget
from dspark.targets import TargetAdapter


@dataclass(frozen=True, kw_only=True)
class TreeBudget:
    """How many of a round's nodes are verified: the ``nodes`` of highest path survival
    (``--tree-nodes``), else Algorithm 1 over ``sps``, else every node of the tree."""

    nodes: int | None = None
    sps: SpsTable | None = None

    def __post_init__(self) -> None:
        if self.nodes is not None and self.nodes < 0:
            raise ValueError(f"tree nodes must be >= 0, got {self.nodes}")


def select_nodes(trees: TreeBlock, budget: TreeBudget) -> TreeBlock:
    """The subtree the budget verifies (closed under parents)."""
    if budget.nodes is None and budget.sps is None:
        return trees
    survival, valid = trees.survival(), trees.valid()  # [R, N]
    if budget.nodes is not None:
        keep = top_nodes(survival, valid, budget.nodes)
    else:
        keep = tree_budget(survival, valid, budget.sps)
    return trees.select(keep.to(trees.tokens.device))


def tree_attention(trees: TreeBlock, context_len: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Positions ``[1, n + 1]`` and mask ``[1, 1, n + 1, C + n + 1]`` of request 0's anchor and nodes.

    Row 0 is the anchor (position C, sees the context and itself); row ``1 + i`` is node i at
    position ``C + depth(i)``, seeing the context, the anchor, its ancestors and itself. A
    chain's mask is the causal one: None then, and the forward takes its causal path.
    """
    n = int(trees.sizes[0])
    C = context_len
    depth = trees.depths()[0, :n]  # [n]
    positions = C + torch.cat([depth.new_zeros(1), depth]).unsqueeze(0)  # [1, n + 1]
    if torch.equal(trees.parents[0, :n], torch.arange(n, device=trees.parents.device) - 1):
        return positions, None
    mask = torch.zeros(n + 1, C + n + 1, dtype=torch.bool)  # [n + 1, C + n + 1]
    mask[:, : C + 1] = True  # the context and the anchor
    mask[1:, C + 1 :] = trees.ancestors()[0, :n, :n]  # node i: its ancestors and itself
    return positions, mask.view(1, 1, n + 1, C + n + 1)


def _tree_round(
    target: TargetAdapter, drafter, req, trees: TreeBlock
) -> tuple[list[int], int, torch.Tensor | None]:
    """Verify request 0's tree in one forward; keep the anchor and the accepted path in the cache.

    Returns the emitted tokens, the accepted drafts and the new features ``[a + 1, L, H]``.
    """
    n = int(trees.sizes[0])
    probs = None if trees.draft_probs is None else trees.draft_probs[:, :n]  # [1, n, V]
    trees = TreeBlock(trees.tokens[:, :n], trees.parents[:, :n], trees.sizes, None, probs)
    anchor = torch.tensor([[req.state.token_ids[-1]]])
    ids = torch.cat([anchor, trees.tokens.cpu()], dim=1).to(target.device)  # [1, n + 1]
    start = req.cache.length
    positions, mask = tree_attention(trees, start)
    layers = tuple(drafter.target_layer_ids)
    out = target.forward(
        ids, req.cache, with_features=bool(layers), layer_ids=layers, positions=positions, attention_mask=mask
    )
    target_probs = batch_probs(out.logits, [req.params])  # [1, n + 1, V]
    result = verify_tree(trees, target_probs, greedy=req.greedy, generators=[req.generator])
    rows = [0] + [1 + i for i in result.paths[0]]  # the anchor and the accepted nodes
    req.cache.keep_rows(start, rows)
    new = None
    if out.features is not None:
        new = out.features[0, rows]  # [a + 1, L, H]
        req.state.features = new if req.state.features is None else torch.cat([req.state.features, new])
    return result.emitted(trees, 0), len(rows) - 1, new


def tree_generate(
    target: TargetAdapter,
    drafter,
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    config: TreeConfig,
    budget: TreeBudget = TreeBudget(),
    block_size: int = 7,
    decode: Callable[[list[int]], str] | None = None,
    on_tokens: OnTokens | None = None,
) -> GenerationResult:
    """Generate up to ``params.max_tokens`` tokens after ``prompt_ids`` with token trees, losslessly.

    ``drafter`` offers ``propose_tree`` (DSpark with a Markov head, DFlash); the other
    arguments are those of :func:`dspark.decoding.loop.speculative_generate`.
    """
    started = time.perf_counter()
    req, max_new = start_request(target, drafter, prompt_ids, params, decode)
    out = Transcript(req.state, params, target.eos_token_ids, max_new, decode, on_tokens, started)
    while not out.finished:
        max_len = out.draft_budget(block_size)  # a round emits at most depth + 1 tokens
        if not out.generated and not drafter_traits(drafter).after_prompt:
            max_len = 0
        if max_len > 0:
            trees = select_nodes(drafter.propose_tree([req.state], max_len, [params], config), budget)
        else:
            empty = torch.zeros(1, 0, dtype=torch.long)
            trees = TreeBlock(empty, empty, torch.zeros(1, dtype=torch.long))
        emitted, accepted, new_features = _tree_round(target, drafter, req, trees)
        out.commit(emitted, int(trees.sizes[0]), accepted)
        drafter.update(req.state, accepted, new_features)
    return out.result()
