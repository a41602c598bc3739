"""Token trees from one backbone forward (``drafters/tree.py``): the chain is the k = 1 tree,
DSpark's children follow the Markov bias of their parent's token, DFlash's do not."""

from __future__ import annotations

import pytest
import torch

from dspark.drafters.tree import build_trees
from dspark.protocols import SamplingParams
from dspark.sampling.tree import ROOT, TreeConfig

from .builders import BLOCK, build, make_state, prompt

GREEDY = SamplingParams(temperature=0.0)
CHAIN = TreeConfig(widths=(1,), frontier=1)


@pytest.mark.parametrize("name", ["dspark_markov", "dflash"])
def test_the_k1_tree_is_the_greedy_chain(target, name):
    """Widths 1: the drafts (and DSpark's confidences) of today's greedy chain, node i under i - 1."""
    drafter = build(name, target)
    states = [make_state(target, prompt(9)), make_state(target, prompt(11, seed=1), 1)]
    chain = drafter.propose(states, BLOCK, [GREEDY, GREEDY])
    trees = build_trees(drafter.tree_slots(states, BLOCK, [GREEDY, GREEDY]), CHAIN)
    assert torch.equal(trees.tokens, chain.tokens)
    assert trees.parents[0].tolist() == [ROOT, 0, 1, 2] and trees.sizes.tolist() == [BLOCK, BLOCK]
    if chain.confidences is not None:
        torch.testing.assert_close(trees.confidences.float(), chain.confidences, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["dspark_markov", "dflash"])
def test_the_sampled_k1_tree_is_the_sampled_chain(target, name):
    """T = 1: the first child is drawn as the chain draws its draft, with the same p_d."""
    params = [SamplingParams(temperature=1.0, seed=4)]
    chain = build(name, target).propose([make_state(target, prompt(9))], BLOCK, params)
    trees = build_trees(build(name, target).tree_slots([make_state(target, prompt(9))], BLOCK, params), CHAIN)
    assert torch.equal(trees.tokens, chain.tokens)
    torch.testing.assert_close(trees.draft_probs, chain.probs)
    assert bool(trees.sampled().all())


def test_sampled_trees_are_grown_in_full_with_one_sampled_child_a_node(target):
    drafter = build("dspark_markov", target)
    params = [SamplingParams(temperature=1.0, seed=4)]
    slots = drafter.tree_slots([make_state(target, prompt(9))], BLOCK, params)
    trees = build_trees(slots, TreeConfig(widths=(3, 2), frontier=2))
    assert trees.sizes.tolist() == [3 + 6 + 12 + 24]  # the frontier is ignored
    sampled, kids = trees.sampled()[0], trees.children()[0]  # [N], [N + 1, W]
    first, others = kids[:, 0], kids[:, 1:]
    assert bool(sampled[first[first >= 0]].all()) and not bool(sampled[others[others >= 0]].any())


def test_dspark_children_follow_their_parents_markov_bias(target):
    drafter = build("dspark_markov", target)
    state = make_state(target, prompt(9))
    slots = drafter.tree_slots([state], BLOCK, [GREEDY])
    trees = build_trees(slots, TreeConfig(widths=(3, 2), depth=2, frontier=None))
    assert trees.sizes.tolist() == [3 + 6]
    head = drafter.markov_head
    for i in range(3):  # depth-2 children of node i: the top 2 of U_1 + W_1[x_i] W_2
        x = trees.tokens[0, i]
        logits = slots.base[0, 1] + head.markov_w2(head.embed(x))
        kids = [j for j in range(9) if int(trees.parents[0, j]) == i]
        assert trees.tokens[0, kids].tolist() == logits.topk(2).indices.tolist()
    second = trees.confidences[0, 3:].view(3, 2)  # [parent, child]: each parent's own distribution
    assert not torch.allclose(second[0], second[1]), "the bias changes nothing"
    survival = trees.survival()[0]  # a child never survives more than its parent
    parent_survival = torch.where(trees.parents[0] >= 0, survival[trees.parents[0].clamp_min(0)], 1.0)
    assert bool((survival <= parent_survival + 1e-12).all())
    siblings = trees.confidences[0, :3]  # the head's c for the first child, lower for the others
    assert bool((siblings[1:] <= siblings[0]).all())


def test_dflash_children_are_the_same_at_every_node(target):
    drafter = build("dflash", target)
    slots = drafter.tree_slots([make_state(target, prompt(9))], BLOCK, [GREEDY])
    trees = build_trees(slots, TreeConfig(widths=(2, 3), depth=2, frontier=None))
    kids = trees.tokens[0, 2:].view(2, 3)
    assert torch.equal(kids[0], kids[1])
    p = torch.softmax(slots.base[0, 1].float(), -1)
    torch.testing.assert_close(trees.confidences[0, 2:5].float(), p.topk(3).values)


def test_the_frontier_limits_which_nodes_get_children(target):
    drafter = build("dspark_markov", target)
    slots = drafter.tree_slots([make_state(target, prompt(9))], BLOCK, [GREEDY])
    trees = build_trees(slots, TreeConfig(widths=(4, 2), frontier=2))
    assert trees.sizes.tolist() == [4 + 2 * 2 + 2 * 2 + 2 * 2]
    survival = trees.survival()[0]
    expanded = sorted(set(trees.parents[0, 4:8].tolist()))
    assert expanded == survival[:4].topk(2).indices.sort().values.tolist()


def test_rnn_head_refuses_trees(target):
    drafter = build("dspark_rnn", target)
    with pytest.raises(ValueError, match="Markov head"):
        drafter.tree_slots([make_state(target, prompt(9))], BLOCK, [GREEDY])
