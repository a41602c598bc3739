"""Chains and trees side by side (``bench/tree_compare.py``, ``dspark bench tree``) on the tiny target."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.bench.tree_compare import compare, tree_arms
from dspark.cli import main
from dspark.data.chat import chat_prompt_ids, user_messages
from dspark.formats.folder import load_drafter
from dspark.formats.shipped import shipped_drafter_dir
from dspark.presets.tiny import builtin_prompts, tiny_target_dir
from dspark.protocols import SamplingParams
from dspark.sampling.tree import TreeConfig
from dspark.scheduler.profile import SpsTable
from dspark.targets import TargetAdapter


@pytest.fixture(scope="module")
def tiny() -> TargetAdapter:
    torch.set_num_threads(1)
    return TargetAdapter.from_pretrained(tiny_target_dir())


def test_arms_verify_what_their_budget_says(tiny):
    drafters = {"dspark": load_drafter(shipped_drafter_dir("dspark", tiny), tiny)}
    ids = [chat_prompt_ids(tiny.tokenizer, user_messages(builtin_prompts("math")[0]["turns"][0]))]
    arms = tree_arms(
        ["dspark"], TreeConfig(widths=(2, 1), frontier=2), block_size=4, node_budgets=[3], sps=SpsTable.flat()
    )
    results = {
        r.arm: r for r in compare(tiny, drafters, arms, ids, SamplingParams(temperature=0.0, max_tokens=24))
    }
    assert set(results) == {"dspark chain 3", "dspark tree 3", "dspark chain alg1", "dspark tree alg1"}
    assert results["dspark chain 3"].nodes_per_round <= 3 and results["dspark tree 3"].nodes_per_round <= 3
    # A flat SPS curve: every node pays, the whole tree (2 + 2 + 2 + 2 nodes, 4 deep) is verified.
    assert results["dspark tree alg1"].nodes_per_round > results["dspark chain alg1"].nodes_per_round
    assert all(r.tau >= 1 and r.sizing in ("3", "alg1") for r in results.values())


def test_bench_tree_command_prints_json_rows(capsys):
    argv = [
        "bench",
        "tree",
        "--bench",
        "math",
        "--limit",
        "1",
        "--max-tokens",
        "8",
        "--no-alg1",
        "--drafters",
        "dspark",
        "--tree-nodes",
        "2",
        "--json",
    ]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["shape"], r["sizing"]) for r in rows] == [("chain", "2"), ("tree", "2")]
