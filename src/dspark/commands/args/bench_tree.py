"""``dspark bench tree``: its arguments and ``--help`` text; the run is
:mod:`dspark.commands.bench_tree`."""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.commands.argtypes import drafter_specs, int_list, non_negative_float, positive_int, prompt_sets
from dspark.commands.options import add_block_size, add_dtype, add_target


def add_bench_tree_args(p: argparse.ArgumentParser) -> None:
    """τ, drafts verified per round and batch-1 tokens/s of chains and token trees, per drafter."""
    add_target(p)
    add_dtype(p)
    p.add_argument(
        "--bench",
        type=prompt_sets,
        default="math,code",
        help="comma-separated prompt sets (built-in names or JSONL paths)",
    )
    p.add_argument("--limit", type=positive_int, default=10, help="prompts per set")
    p.add_argument(
        "--drafters",
        type=drafter_specs,
        default="dspark,dflash",
        help="comma-separated drafters that grow token trees: dspark, dflash (shipped names) or their "
        "folders; eagle3 has no tree yet",
    )
    p.add_argument("--max-tokens", type=positive_int, default=128, help="tokens per answer")
    add_block_size(p, help="the deepest a tree or an Algorithm 1 chain grows")
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy; > 0 samples")
    p.add_argument(
        "--tree-widths", type=int_list, default=[4, 2, 2, 1], help="children per node at each depth"
    )
    p.add_argument(
        "--tree-frontier", type=positive_int, default=4, help="nodes expanded per depth (greedy trees)"
    )
    p.add_argument(
        "--tree-nodes",
        type=int_list,
        default=[7],
        help="verified-node budgets: at each N, the tree's N best nodes against the chain of N drafts",
    )
    p.add_argument(
        "--no-alg1", action="store_true", help="skip the arms sized by Algorithm 1 (no SPS profile)"
    )
    p.add_argument(
        "--sps", type=Path, default=None, help="an SPS table (JSON) instead of profiling the batch-1 loop"
    )
    p.add_argument(
        "--plot", type=Path, default=None, help="write τ against verified nodes per round here (PNG)"
    )
    p.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
