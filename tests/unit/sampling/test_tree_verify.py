"""Token-tree verification (``sampling/tree.py``): structure helpers, chain equality, losslessness.

The statistical test generates several rounds on a Markov-chain toy: the target's next
token depends on the previous one (table ``T``), the drafter's top-k children come from
a different table ``D``, and every round verifies a fixed tree grown from the request's
last token. The first three generated tokens must follow ``T[s, a] T[a, b] T[b, c]``.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch

from dspark.sampling import rejection, tree
from dspark.sampling.rejection import verify
from dspark.sampling.tree import ROOT, TreeBlock, verify_tree

N_REQUESTS = 20_000
ALPHA = 1e-3


def small_tree() -> TreeBlock:
    """Request 0: anchor → {0, 1}, 0 → {2}, 2 → {3}; request 1: anchor → {0}, 4 nodes padded."""
    tokens = torch.tensor([[5, 6, 7, 8], [9, 0, 0, 0]])
    parents = torch.tensor([[ROOT, ROOT, 0, 2], [ROOT, ROOT, ROOT, ROOT]])
    conf = torch.tensor([[0.8, 0.1, 0.5, 0.5], [0.9, 0.0, 0.0, 0.0]])
    return TreeBlock(tokens, parents, torch.tensor([4, 1]), conf)


def test_structure_helpers():
    t = small_tree()
    assert t.depths().tolist() == [[1, 1, 2, 3], [1, 0, 0, 0]]
    assert t.ancestors()[0, 3].tolist() == [True, False, True, True]
    assert not bool(t.ancestors()[1, 1:].any())
    torch.testing.assert_close(t.survival()[0], torch.tensor([0.8, 0.1, 0.4, 0.2], dtype=torch.float64))
    assert t.children()[0].tolist() == [[0, 1], [2, -1], [-1, -1], [3, -1], [-1, -1]]
    assert t.children()[1, 0].tolist() == [0, -1]
    sub = t.select(torch.tensor([[True, False, True, False], [True, True, True, True]]))
    assert sub.sizes.tolist() == [2, 1]
    assert sub.tokens[0].tolist() == [5, 7] and sub.parents[0].tolist() == [ROOT, 0]
    with pytest.raises(AssertionError, match="parent must be kept"):
        t.select(torch.tensor([[False, True, True, False], [True, False, False, False]]))


@pytest.mark.parametrize("greedy", [False, True])
def test_a_chain_tree_is_verified_exactly_as_the_chain(greedy):
    """k = 1: the same accepted counts and next tokens as ``rejection.verify`` with one-hot
    drafts, sample for sample, from per-request generators seeded alike."""
    R, K, V = 400, 5, 16
    g = torch.Generator().manual_seed(0)
    p_t = torch.softmax(2 * torch.randn(R, K + 1, V, generator=g), dim=-1)
    drafts = torch.multinomial(p_t[:, :K].reshape(-1, V), 1, generator=g).view(R, K)  # [R, K] often accepted
    lengths = torch.randint(0, K + 1, (R,), generator=g)
    greedy_mask = torch.full((R,), greedy)
    chain = verify(
        drafts,
        lengths,
        None,
        p_t,
        greedy=greedy_mask,
        generators=[torch.Generator().manual_seed(r) for r in range(R)],
    )
    # The tree's row 1 + i is the target after node i, i.e. the chain's row i + 1: the same tensor.
    out = verify_tree(
        TreeBlock.chain(drafts, lengths),
        p_t,
        greedy=greedy_mask,
        generators=[torch.Generator().manual_seed(r) for r in range(R)],
    )
    assert torch.equal(out.num_accepted, chain.num_accepted)
    assert torch.equal(out.next_tokens, chain.next_tokens)
    assert 0 < int(chain.num_accepted.sum()) < int(lengths.sum())


def test_a_sampled_chain_tree_is_verified_exactly_as_the_chain():
    """T = 1 with drafts sampled from ``p_d``: the tree's ratio test and residual are the chain's."""
    R, K, V = 400, 5, 16
    g = torch.Generator().manual_seed(1)
    p_t = torch.softmax(2 * torch.randn(R, K + 1, V, generator=g), dim=-1)
    p_d = torch.softmax(torch.log(p_t[:, :K]) + torch.randn(R, K, V, generator=g), dim=-1)
    drafts = torch.multinomial(p_d.reshape(-1, V), 1, generator=g).view(R, K)  # [R, K]
    lengths = torch.randint(0, K + 1, (R,), generator=g)
    chain = verify(drafts, lengths, p_d, p_t, generators=[torch.Generator().manual_seed(r) for r in range(R)])
    out = verify_tree(
        TreeBlock.chain(drafts, lengths, draft_probs=p_d),
        p_t,
        generators=[torch.Generator().manual_seed(r) for r in range(R)],
    )
    assert torch.equal(out.num_accepted, chain.num_accepted)
    assert torch.equal(out.next_tokens, chain.next_tokens)


# -- the Markov toy ---------------------------------------------------------------------


def toy_tables(V: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Target ``T [V, V]`` and a nearby drafter table ``D [V, V]``; row = previous token."""
    g = torch.Generator().manual_seed(seed)
    logits = 1.5 * torch.randn(V, V, generator=g)
    return torch.softmax(logits, -1), torch.softmax(logits + 1.0 * torch.randn(V, V, generator=g), -1)


def toy_tree(D: torch.Tensor, prev: int, widths: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """A full top-k tree under ``prev`` from the drafter table: tokens and parents, BFS order."""
    tokens, parents = [], []
    frontier = [(ROOT, prev)]
    for k in widths:
        nxt = []
        for node, tok in frontier:
            for child in D[tok].topk(k).indices.tolist():
                tokens.append(child)
                parents.append(node)
                nxt.append((len(tokens) - 1, child))
        frontier = nxt
    return tokens, parents


def fixed_trees(D, widths):
    """Grow one-hot top-k trees: one per previous token, looked up per request."""
    table = [toy_tree(D, prev, widths) for prev in range(D.shape[0])]
    tok_table = torch.tensor([t for t, _ in table])  # [V, N]
    par_table = torch.tensor([p for _, p in table])  # [V, N]

    def grow(prev: torch.Tensor, g) -> TreeBlock:
        return TreeBlock(tok_table[prev], par_table[prev], torch.full(prev.shape, tok_table.shape[1]))

    return grow


def generate(T, grow, start: int, R: int, n: int, seed: int, verify_fn=verify_tree) -> torch.Tensor:
    """``[R, n]``: the first n tokens each of R requests generates from ``start``, round by round;
    ``grow(prev [r], g)`` makes the round's trees under each request's last token."""
    out = [[] for _ in range(R)]
    last = torch.full((R,), start)
    g = torch.Generator().manual_seed(seed)
    todo = torch.arange(R)
    while todo.numel():
        prev = last[todo]
        trees = grow(prev, g)
        rows = torch.cat([prev.unsqueeze(1), trees.tokens], dim=1)  # [r, N + 1] token before each row
        res = verify_fn(trees, T[rows], generators=g)
        for i, r in enumerate(todo.tolist()):
            out[r].extend(res.emitted(trees, i))
            last[r] = out[r][-1]
        todo = torch.tensor([r for r in todo.tolist() if len(out[r]) < n], dtype=torch.long)
    return torch.tensor([o[:n] for o in out])


def sampled_trees(D, widths, confidence=None):
    return lambda prev, g: _sampled_trees(D, prev, widths, g, confidence)


def _sampled_trees(D, prev: torch.Tensor, widths, g, confidence=None) -> TreeBlock:
    """Per request: at every node a first child drawn from ``D[node]``, then its top siblings;
    ``confidence(p [R, n, V], kids [R, n, k]) -> [R, n, k]`` gives the nodes confidences."""
    R, V = prev.shape[0], D.shape[0]
    tokens, parents, probs, confs = [], [], [], []
    frontier, where, count = prev.view(R, 1), torch.full((R, 1), ROOT), 0
    for k in widths:
        n = frontier.shape[1]
        p = D[frontier]  # [R, n, V]
        first = torch.multinomial(p.reshape(-1, V), 1, generator=g).view(R, n, 1)
        others = p.scatter(-1, first, -1.0).topk(k - 1, dim=-1).indices  # [R, n, k - 1]
        kids = torch.cat([first, others], dim=-1)  # [R, n, k]
        rows = torch.zeros(R, n, k, V)
        rows[:, :, 0] = p  # only the first child was sampled
        tokens.append(kids.reshape(R, n * k))
        parents.append(where.unsqueeze(-1).expand(R, n, k).reshape(R, n * k))
        probs.append(rows.reshape(R, n * k, V))
        if confidence is not None:
            confs.append(confidence(p, kids).reshape(R, n * k))
        frontier, where = kids.reshape(R, n * k), count + torch.arange(n * k).expand(R, n * k)
        count += n * k
    conf = torch.cat(confs, 1) if confs else None
    return TreeBlock(
        torch.cat(tokens, 1), torch.cat(parents, 1), torch.full((R,), count), conf, torch.cat(probs, 1)
    )


def joint_pvalue(chi2_pvalue, T, start, seqs) -> float:
    V = T.shape[0]
    a, b, c = seqs.unbind(-1)
    joint = T[start].view(V, 1, 1) * T.view(V, V, 1) * T.view(1, V, V)  # [V, V, V]
    return chi2_pvalue(a * V * V + b * V + c, joint.flatten())


@cache
def toy_run(widths: tuple[int, ...]):
    T, D = toy_tables(8, seed=21)
    return T, generate(T, fixed_trees(D, widths), start=0, R=N_REQUESTS, n=3, seed=5)


@pytest.mark.parametrize("widths", [(3, 2, 1), (1, 1, 1, 1), (4,)])
def test_generated_tokens_follow_the_target(chi2_pvalue, widths):
    T, seqs = toy_run(widths)
    assert joint_pvalue(chi2_pvalue, T, 0, seqs) > ALPHA


@pytest.mark.parametrize("bug", ["residual_not_updated", "node_rows_from_the_anchor"])
def test_negative_controls_are_rejected(chi2_pvalue, monkeypatch, bug):
    """The same check must catch a broken tree sampler, or it proves nothing."""
    T, D = toy_tables(8, seed=21)
    verify_fn = verify_tree
    if bug == "residual_not_updated":  # a rejected child stays in q: later siblings tested against p_t
        monkeypatch.setattr(tree, "one_hot_residual", lambda q, x: q)
    else:  # every node scored with the anchor's row: the target's context ignored below the root

        def verify_fn(trees, probs, **kw):
            return verify_tree(trees, probs[:, :1].expand_as(probs), **kw)

    seqs = generate(T, fixed_trees(D, (3, 2, 1)), start=0, R=N_REQUESTS, n=3, seed=6, verify_fn=verify_fn)
    assert joint_pvalue(chi2_pvalue, T, 0, seqs) < 1e-6


@pytest.mark.parametrize("bug", [None, "sampled_residual_not_updated", "ratio_test_without_p_d"])
def test_sampled_first_children_follow_the_target(chi2_pvalue, monkeypatch, bug):
    T, D = toy_tables(8, seed=21)
    if bug == "sampled_residual_not_updated":  # q left at p_t after a sampled child is rejected
        monkeypatch.setattr(tree, "residual_distribution", lambda q, p_d: q)
    elif bug == "ratio_test_without_p_d":  # accepted with q(x), yet the residual subtracts p_d
        monkeypatch.setattr(tree, "accept_test", lambda q_x, p_d_x, u: u < q_x)
    seqs = generate(T, sampled_trees(D, (3, 2, 1)), start=0, R=N_REQUESTS, n=3, seed=8)
    pvalue = joint_pvalue(chi2_pvalue, T, 0, seqs)
    assert pvalue < 1e-6 if bug else pvalue > ALPHA


def test_greedy_follows_the_target_argmax_path():
    """Greedy: the accepted path is the target's argmax walk through the tree, then its argmax."""
    T, D = toy_tables(8, seed=3)
    for prev in range(8):
        tokens, parents = toy_tree(D, prev, (3, 2, 1))
        trees = TreeBlock(torch.tensor([tokens]), torch.tensor([parents]), torch.tensor([len(tokens)]))
        rows = torch.tensor([[prev] + tokens])
        out = verify_tree(trees, T[rows], greedy=torch.tensor([True]))
        expected, node, tok = [], ROOT, prev
        while True:
            best = int(T[tok].argmax())
            kids = [i for i, p in enumerate(parents) if p == node and tokens[i] == best]
            if not kids:
                break
            node, tok = kids[0], best
            expected.append(best)
        assert out.emitted(trees, 0) == expected + [int(T[tok].argmax())]


def test_no_uniforms_are_drawn_when_all_greedy():
    t = small_tree()
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    verify_tree(t, torch.softmax(torch.randn(2, 5, 16), -1), greedy=torch.tensor([True, True]), generators=g)
    assert torch.equal(g.get_state(), state)
    assert rejection.draw_uniforms is tree.draw_uniforms  # one source of uniforms for chain and tree


def test_greedy_rows_of_a_mixed_batch_walk_as_an_all_greedy_batch():
    T, D = toy_tables(8, seed=3)
    trees = sampled_trees(D, (3, 2, 1))(torch.arange(8), torch.Generator().manual_seed(0))
    probs = T[torch.cat([torch.arange(8).unsqueeze(1), trees.tokens], dim=1)]  # [8, N + 1, V]
    mixed = verify_tree(
        trees, probs, greedy=torch.arange(8) % 2 == 0, generators=torch.Generator().manual_seed(1)
    )
    alone = verify_tree(trees, probs, greedy=torch.ones(8, dtype=torch.bool))
    for r in range(0, 8, 2):
        assert mixed.paths[r] == alone.paths[r] and mixed.next_tokens[r] == alone.next_tokens[r]
