"""Chains and token trees on the batch-1 loops of the tiny target (``eval/tree_compare.py``).

Per drafter (DSpark, DFlash; Eagle3's chain for reference), on the built-in math and
code prompts, greedy and T = 1: the chain of γ = 7, the tree at the chain's verification
budget (``--tree-nodes 7``), the chain and the tree sized by Algorithm 1 over this
machine's batch-1 SPS curve (profiled first), and the whole tree. One thread, fp32.

    python scripts/bench_tree.py [n_prompts] [max_tokens] [widths] [frontier]
"""

# ruff: noqa: E501 (report lines)
import sys
import time

import torch

from dspark.data.chat import chat_prompt_ids, user_messages
from dspark.decoding.tree_loop import TreeBudget
from dspark.drafters.folder import load_drafter
from dspark.drafters.shipped import shipped_drafter_dir
from dspark.drafters.tree import TreeConfig
from dspark.eval.tree_compare import Arm, batch1_sps, compare
from dspark.presets.tiny import builtin_prompts, tiny_target_dir
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter

torch.set_num_threads(1)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 10
MAX_TOKENS = int(sys.argv[2]) if len(sys.argv) > 2 else 128
WIDTHS = tuple(int(w) for w in (sys.argv[3] if len(sys.argv) > 3 else "4,2,2,1").split(","))
FRONTIER = int(sys.argv[4]) if len(sys.argv) > 4 else 4

target = TargetAdapter.from_pretrained(tiny_target_dir())
drafters = {m: load_drafter(shipped_drafter_dir(m, target), target) for m in ("dspark", "dflash", "eagle3")}
started = time.perf_counter()
sps = batch1_sps(target)
print(
    f"batch-1 SPS profile ({time.perf_counter() - started:.0f} s): "
    + ", ".join(
        f"B={b}: {s:.0f}/s"
        for b, s in zip(sps.tokens, sps.steps_per_s)
        if b in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
    )
)
tree = TreeConfig(widths=WIDTHS, frontier=FRONTIER)
chain = TreeConfig(widths=(1,), frontier=1)
arms = [Arm(name="eagle3 chain 7", drafter="eagle3")]
for m in ("dspark", "dflash"):
    arms += [
        Arm(name=f"{m} chain 7", drafter=m),
        Arm(name=f"{m} tree nodes=7", drafter=m, tree=tree, budget=TreeBudget(nodes=7)),
        Arm(name=f"{m} chain alg1", drafter=m, tree=chain, budget=TreeBudget(sps=sps)),
        Arm(name=f"{m} tree alg1", drafter=m, tree=tree, budget=TreeBudget(sps=sps)),
        Arm(name=f"{m} tree all", drafter=m, tree=tree),
    ]
print(f"tree widths {WIDTHS} frontier {FRONTIER}; {N} prompts a domain, max_tokens {MAX_TOKENS}")
for domain in ("math", "code"):
    prompts = [
        chat_prompt_ids(target.tokenizer, user_messages(r["turns"][0])) for r in builtin_prompts(domain)[:N]
    ]
    for temp in (0.0, 1.0):
        params = SamplingParams(temperature=temp, max_tokens=MAX_TOKENS, seed=0 if temp else None)
        results = compare(target, drafters, arms, prompts, params)
        base = {r.drafter: r for r in results if r.arm.endswith("chain 7")}
        print(f"\n{domain}, T = {temp:g}")
        print(f"{'arm':22s} {'tau':>5s} {'nodes/rd':>8s} {'tok/s':>6s} {'x chain7':>8s} {'tau x':>6s}")
        for r in results:
            b = base[r.drafter]
            print(
                f"{r.arm:22s} {r.tau:5.2f} {r.nodes_per_round:8.2f} {r.tokens_per_s:6.1f} {r.tokens_per_s / b.tokens_per_s:8.2f} {r.tau / b.tau:6.2f}"
            )
