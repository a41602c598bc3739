"""Decoding and verifying runs in one attention group or two (issue 17, ``targets/flat.py``).

One flat target forward over ``R`` requests with ``START`` tokens cached each: one request
verifying 2 or 8 tokens, a quarter of them or half verifying 8, the others decoding one.
Each step runs as ``FlatStep.build`` lays it out (``rule``: one group while it pads to at
most ``MERGE_PADDING`` times the real rows) and with the two groups always apart
(``split``), alternating, 15 times each. Thread CPU time, medians, one thread, fp32.

    python scripts/bench_flat_groups.py tiny 400 4,16,64
"""

# ruff: noqa: E501 (report lines)
import statistics
import sys
import time

import torch

import dspark.targets.flat as flat
from dspark.commands.loading import load_target
from dspark.targets.flat import KVStore, Run, flat_forward

torch.set_num_threads(1)
target = load_target(None if sys.argv[1] == "tiny" else sys.argv[1], dtype=torch.float32)
START = int(sys.argv[2]) if len(sys.argv) > 2 else 400
RULE = flat.MERGE_PADDING


def step(store: KVStore, lengths: list[int]) -> None:
    runs = [Run(slot=i, start=START, length=n) for i, n in enumerate(lengths)]
    ids = torch.randint(5, 100, (sum(lengths),))
    at = torch.cumsum(torch.tensor(lengths), 0) - 1
    flat_forward(target, store, ids, runs, logits_at=at, with_features=True)


for R in (int(r) for r in (sys.argv[3] if len(sys.argv) > 3 else "4,16,64").split(",")):
    store = KVStore.for_target(target, num_slots=R, capacity=START + 16)
    Q = max(R // 4, 1)
    cases = {
        f"1 x 2 + {R - 1} x 1": [2] + [1] * (R - 1),
        f"1 x 8 + {R - 1} x 1": [8] + [1] * (R - 1),
        f"{Q} x 8 + {R - Q} x 1 (spread)": [8 if i % (R // Q) == 0 else 1 for i in range(R)],
        f"{R // 2} x 8 + {R - R // 2} x 1 (spread)": [8 if i % 2 == 0 else 1 for i in range(R)],
    }
    for name, lengths in cases.items():
        times: dict[str, list[float]] = {"split": [], "rule": []}
        for _ in range(15):
            for variant, samples in times.items():
                flat.MERGE_PADDING = 0.0 if variant == "split" else RULE
                started = time.thread_time()
                step(store, lengths)
                samples.append(time.thread_time() - started)
        flat.MERGE_PADDING = RULE
        split, rule = (1e3 * statistics.median(t) for t in times.values())
        groups = len(flat.FlatStep.build(store, [Run(i, START, n) for i, n in enumerate(lengths)]).groups)
        print(
            f"R = {R:3d} {name:>28}: split {split:7.2f} ms, rule {rule:7.2f} ms ({rule / split:.3f}x, {groups} group{'s' * (groups > 1)})",
            flush=True,
        )
