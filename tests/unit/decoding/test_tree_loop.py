"""Batch-1 token-tree decoding (``decoding/tree_loop.py``) on the embedded tiny target and its
shipped drafters: the tree mask, greedy equality with plain decoding, the k = 1 tree is the chain."""

from __future__ import annotations

import pytest
import torch

from dspark.data.chat import chat_prompt_ids, user_messages
from dspark.decoding.loop import speculative_generate
from dspark.decoding.tree_loop import TreeBudget, tree_attention, tree_generate
from dspark.drafters.tree import build_trees
from dspark.formats.folder import load_drafter
from dspark.formats.shipped import shipped_drafter_dir
from dspark.presets.tiny import builtin_prompts, tiny_target_dir
from dspark.protocols import SamplingParams, SequenceState
from dspark.sampling.tree import TreeConfig
from dspark.scheduler.profile import SpsTable
from dspark.targets import TargetAdapter

GREEDY = SamplingParams(temperature=0.0, max_tokens=32)
TREE = TreeConfig(widths=(3, 2, 1), frontier=4)


@pytest.fixture(scope="module")
def tiny() -> TargetAdapter:
    torch.set_num_threads(1)
    return TargetAdapter.from_pretrained(tiny_target_dir())


@pytest.fixture(scope="module")
def prompts(tiny) -> list[list[int]]:
    records = builtin_prompts("math")[:1] + builtin_prompts("code")[:1]
    return [chat_prompt_ids(tiny.tokenizer, user_messages(r["turns"][0])) for r in records]


@pytest.fixture(scope="module")
def plain(tiny, prompts) -> list[list[int]]:
    """Plain greedy decoding of each prompt."""
    return [speculative_generate(tiny, None, ids, GREEDY).token_ids for ids in prompts]


def drafter_for(tiny, method: str):
    return load_drafter(shipped_drafter_dir(method, tiny), tiny)


def test_tree_attention_gives_each_node_its_path_logits(tiny, prompts):
    """The tree forward's logits at node i equal a plain forward over the context and i's path."""
    drafter = drafter_for(tiny, "dspark")
    ids = prompts[0]
    cache = tiny.new_cache()
    feats = tiny.forward(torch.tensor([ids[:-1]]), cache, layer_ids=drafter.target_layer_ids).features
    state = SequenceState(0, list(ids), len(ids))
    state.features = feats[0]
    trees = build_trees(drafter.tree_slots([state], 3, [GREEDY]), TreeConfig(widths=(2, 2, 1), frontier=None))
    n = int(trees.sizes[0])
    positions, mask = tree_attention(trees, cache.length)
    tree_ids = torch.cat([torch.tensor([[ids[-1]]]), trees.tokens], dim=1)  # [1, n + 1]
    out = tiny.forward(tree_ids, cache, with_features=False, positions=positions, attention_mask=mask)
    anc = trees.ancestors()[0]
    for i in range(n):
        path = trees.tokens[0, anc[i].nonzero().flatten()].tolist()
        plain = tiny.forward(torch.tensor([ids + path]), tiny.new_cache(), with_features=False).logits
        torch.testing.assert_close(out.logits[0, 1 + i], plain[0, -1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["dspark", "dflash"])
@pytest.mark.parametrize(
    "budget",
    [TreeBudget(), TreeBudget(nodes=7), TreeBudget(sps=SpsTable.from_dict({1: 50.0, 8: 45.0, 32: 20.0}))],
    ids=["all", "nodes7", "algorithm1"],
)
def test_greedy_tree_decoding_equals_plain_decoding(tiny, prompts, plain, method, budget):
    drafter = drafter_for(tiny, method)
    accepted = 0
    for ids, expected in zip(prompts, plain):
        tree = tree_generate(tiny, drafter, ids, GREEDY, config=TREE, budget=budget)
        assert tree.token_ids == expected
        accepted += sum(r.accepted for r in tree.rounds)
        if budget.nodes is not None:
            assert max(r.proposed for r in tree.rounds) <= budget.nodes
    assert accepted > 0, "no draft was ever accepted: the test exercises nothing"


@pytest.mark.parametrize("method", ["dspark", "dflash"])
@pytest.mark.parametrize(
    "params", [GREEDY, SamplingParams(temperature=1.0, seed=5, max_tokens=32)], ids=["greedy", "T1"]
)
def test_the_k1_tree_loop_is_the_chain_loop(tiny, prompts, method, params):
    """Widths 1: the same tokens and the same accepted drafts round by round, greedy and
    sampled (the tree's first child is drawn as the chain draws its draft)."""
    drafter = drafter_for(tiny, method)
    k1 = TreeConfig(widths=(1,), frontier=1)
    for ids in prompts:
        chain = speculative_generate(tiny, drafter, ids, params, block_size=drafter.block_size)
        tree = tree_generate(tiny, drafter, ids, params, config=k1, block_size=drafter.block_size)
        assert tree.token_ids == chain.token_ids
        assert [(r.proposed, r.accepted) for r in tree.rounds] == [
            (r.proposed, r.accepted) for r in chain.rounds
        ]


def test_sampled_tree_decoding_is_reproducible_from_its_seed(tiny, prompts):
    drafter = drafter_for(tiny, "dspark")
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=24)
    first = tree_generate(tiny, drafter, prompts[0], params, config=TREE)
    again = tree_generate(tiny, drafter, prompts[0], params, config=TREE)
    assert first.token_ids == again.token_ids and len(first.token_ids) > 0
