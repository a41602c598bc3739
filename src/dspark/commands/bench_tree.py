"""``dspark bench tree``: chains and token trees side by side on the batch-1 loops.

The measuring lives in :mod:`dspark.bench.tree_compare`; this module parses, runs and prints.
"""

from __future__ import annotations

import argparse
import json

from dspark.bench.tree_compare import batch1_sps, compare, tree_arms
from dspark.commands.loading import load_inference_target
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.eval.plots import plot_sweep_lines
from dspark.formats.build import build_drafter
from dspark.protocols import SamplingParams
from dspark.sampling.tree import TreeConfig
from dspark.scheduler.profile import SpsTable


def main_bench_tree(args: argparse.Namespace) -> int:
    """Run ``dspark bench tree`` (arguments: :mod:`~dspark.commands.args.bench_tree`)."""
    prompt_sets = {bench: load_prompts(bench, args.limit) for bench in args.bench.split(",")}
    target = load_inference_target(args.target, args.dtype)
    names = [n.strip() for n in args.drafters.split(",") if n.strip()]
    drafters = {name: build_drafter(name, target) for name in names}
    sps = None if args.no_alg1 else (SpsTable.load(args.sps) if args.sps else batch1_sps(target))
    tree = TreeConfig(widths=tuple(args.tree_widths), frontier=args.tree_frontier)
    arms = tree_arms(names, tree, block_size=args.block_size, node_budgets=args.tree_nodes, sps=sps)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=0)
    rows, panels = [], {}
    for bench, prompts in prompt_sets.items():
        ids = [prompt_ids(target.tokenizer, p) for p in prompts]
        ids = [i for i in ids if len(i) + args.max_tokens <= target.max_context]
        results = compare(target, drafters, arms, ids, params)
        chains = {
            r.drafter: r for r in results if r.shape == "chain" and r.sizing == str(args.tree_nodes[-1])
        }
        for r in results:
            rows.append(
                {
                    "bench": bench,
                    **r.as_dict(),
                    "speed_vs_chain": r.tokens_per_s / chains[r.drafter].tokens_per_s,
                }
            )
            if r.sizing.isdigit():
                panels.setdefault(bench, {}).setdefault(f"{r.drafter} {r.shape}", {})[int(r.sizing)] = r.tau
    if args.plot is not None:
        plot_sweep_lines(panels, args.plot, xlabel="drafts verified per round", ylabel="τ (tokens per round)")
    if args.json:
        table = None if sps is None else {"tokens": list(sps.tokens), "steps_per_s": list(sps.steps_per_s)}
        print(json.dumps({"rows": rows, "temperature": args.temperature, "sps": table}, indent=2))
        return 0
    last = args.tree_nodes[-1]
    print(f"{'bench':<10}{'arm':<22}{'tau':>6}{'nodes/rd':>10}{'tok/s':>8}  x chain {last}")
    for r in rows:
        print(
            f"{r['bench'][-10:]:<10}{r['arm']:<22}{r['tau']:>6.2f}{r['nodes_per_round']:>10.2f}"
            f"{r['tokens_per_s']:>8.1f}  {r['speed_vs_chain']:.2f}"
        )
    return 0
