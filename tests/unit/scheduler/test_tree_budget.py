"""Algorithm 1 over tree nodes (``scheduler/tree_budget.py``): chains, parents first, the SPS curve."""

from __future__ import annotations

import pytest
import torch

from dspark.sampling.tree import ROOT, TreeBlock
from dspark.scheduler.policies import prefix_lengths
from dspark.scheduler.profile import SpsTable
from dspark.scheduler.tree_budget import top_nodes, tree_budget

from ..sampling.conftest import chi2_pvalue
from ..sampling.test_tree_verify import ALPHA, generate, joint_pvalue, sampled_trees, toy_tables

TABLES = {
    "flat": SpsTable.flat(),
    "knee": SpsTable.from_dict({1: 100.0, 4: 95.0, 8: 60.0, 16: 30.0, 64: 8.0}),
    "linear": SpsTable.from_dict({b: 100.0 / b for b in (1, 2, 4, 8, 16, 32, 64)}),
}


def random_trees(R: int, N: int, seed: int) -> TreeBlock:
    g = torch.Generator().manual_seed(seed)
    parents = torch.stack(
        [torch.randint(-1, i, (R,), generator=g) if i else torch.full((R,), -1) for i in range(N)], 1
    )
    sizes = torch.randint(1, N + 1, (R,), generator=g)
    conf = torch.rand(R, N, generator=g, dtype=torch.float64) ** 0.3
    conf[0, 1] = 1.0  # a tie with the parent must still rank the parent first
    return TreeBlock(torch.zeros(R, N, dtype=torch.long), parents, sizes, conf)


def closed_under_parents(tree: TreeBlock, keep: torch.Tensor) -> bool:
    parent_kept = torch.where(tree.parents >= 0, keep.gather(1, tree.parents.clamp_min(0)), True)
    return bool((parent_kept | ~keep).all())


@pytest.mark.parametrize("table", list(TABLES))
def test_a_chain_is_algorithm_1(table):
    g = torch.Generator().manual_seed(1)
    R, K = 6, 7
    conf = torch.rand(R, K, generator=g, dtype=torch.float64) ** 0.4
    caps = torch.randint(0, K + 1, (R,), generator=g)
    chain = TreeBlock.chain(torch.zeros(R, K, dtype=torch.long), caps, conf)
    keep = tree_budget(chain.survival(), chain.valid(), TABLES[table], base_tokens=2)
    lengths = prefix_lengths(conf, caps, TABLES[table], base_tokens=2)
    assert keep.sum(-1).tolist() == lengths.tolist()
    assert closed_under_parents(chain, keep)


@pytest.mark.parametrize("table", list(TABLES))
def test_a_node_is_admitted_only_with_its_parent(table):
    trees = random_trees(5, 12, seed=2)
    keep = tree_budget(trees.survival(), trees.valid(), TABLES[table])
    assert closed_under_parents(trees, keep)
    assert not bool((keep & ~trees.valid()).any())
    # The admitted nodes are the best by survival: none left out beats one let in.
    a = trees.survival()
    if bool(keep.any()) and bool((trees.valid() & ~keep).any()):
        assert float(a[keep].min()) >= float(a[trees.valid() & ~keep].max())


def test_the_sps_curve_decides_at_batch_one():
    """One request, step time linear in B: a node pays only if its survival beats Θ so far."""
    tree = TreeBlock(
        torch.zeros(1, 3, dtype=torch.long),
        torch.tensor([[ROOT, 0, ROOT]]),
        torch.tensor([3]),
        torch.tensor([[0.9, 0.9, 0.5]], dtype=torch.float64),
    )
    linear = TABLES["linear"]
    assert tree_budget(tree.survival(), tree.valid(), linear).sum() == 0  # (1 + 0.9) / 2 < 1
    assert tree_budget(tree.survival(), tree.valid(), SpsTable.flat()).tolist() == [[True, True, True]]
    knee = TABLES["knee"]  # cheap to B = 4: the best nodes fit under the knee
    assert tree_budget(tree.survival(), tree.valid(), knee).sum() == 3


def test_top_nodes_keeps_n_best_per_request():
    trees = random_trees(4, 10, seed=3)
    keep = top_nodes(trees.survival(), trees.valid(), 3)
    assert keep.sum(-1).tolist() == trees.sizes.clamp(max=3).tolist()
    assert closed_under_parents(trees, keep)


def _honest(p, kids):
    """The i-th child's confidence is the i-th largest probability, whichever token was drawn."""
    return p.sort(dim=-1, descending=True).values[..., : kids.shape[-1]].double()


def _anticipating(p, kids):
    """Bug: a sampled child's confidence is its own probability, so its admission reads its token."""
    return p.gather(-1, kids).double()


@pytest.mark.parametrize("rule", ["honest", "anticipating"])
def test_a_budgeted_sampled_tree_stays_lossless_only_without_anticipation(rule):
    """Sampled first children under Algorithm 1 over the whole batch: lossless when the ranking
    never reads a sampled token (paper Appendix A, for trees); the negative control reads it."""
    T, D = toy_tables(8, seed=21)
    R = 20_000
    sps = SpsTable.from_dict({1: 1.0, 2 * R: 1.0, 20 * R: 0.1})  # free up to 2R tokens, then linear
    grow_full = sampled_trees(D, (3, 2, 1), _honest if rule == "honest" else _anticipating)

    def grow(prev, g):
        trees = grow_full(prev, g)
        keep = tree_budget(trees.survival(), trees.valid(), sps)
        assert 0 < int(keep.sum()) < int(trees.sizes.sum()), "the budget must cut somewhere"
        return trees.select(keep)

    seqs = generate(T, grow, start=0, R=R, n=3, seed=9)
    pvalue = joint_pvalue(chi2_pvalue, T, 0, seqs)
    assert pvalue > ALPHA if rule == "honest" else pvalue < 1e-6
