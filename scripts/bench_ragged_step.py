"""What a few verifying requests cost a step of many decoding ones (issue 17).

One flat target forward (``targets/flat.py``) over ``R`` requests (default 64) with ``START``
tokens each in their slots: all decoding one token, one of them verifying 2 or 8, a quarter
spread over the slots verifying 8, all verifying 8, and as many tokens as those steps
decoded by more requests (what a line in tokens alone would price them at). Thread CPU time, medians of 7, one thread, fp32. Before
single-token and multi-token runs attended in separate groups, every row of a step was
padded to its longest run.

    python scripts/bench_ragged_step.py tiny 400 [R]
"""

# ruff: noqa: E501 (report lines)
import statistics
import sys
import time

import torch

from dspark.commands.loading import load_target
from dspark.targets.flat import KVStore, Run, flat_forward

torch.set_num_threads(1)
target = load_target(None if sys.argv[1] == "tiny" else sys.argv[1], dtype=torch.float32)
START = int(sys.argv[2]) if len(sys.argv) > 2 else 400
R = int(sys.argv[3]) if len(sys.argv) > 3 else 64
store = KVStore.for_target(target, num_slots=3 * R, capacity=START + 16)


def step(lengths: list[int]) -> None:
    runs = [Run(slot=i, start=START, length=n) for i, n in enumerate(lengths)]
    ids = torch.randint(5, 100, (sum(lengths),))
    at = torch.cumsum(torch.tensor(lengths), 0) - 1
    flat_forward(target, store, ids, runs, logits_at=at, with_features=True)


def median_ms(lengths: list[int]) -> float:
    times = []
    for _ in range(7):
        t = time.thread_time()
        step(lengths)
        times.append(time.thread_time() - t)
    return 1e3 * statistics.median(times)


Q = max(R // 4, 1)
cases = {
    f"{R} x 1": [1] * R,
    f"1 x 2 + {R - 1} x 1": [2] + [1] * (R - 1),
    f"{R + 1} x 1 (as many tokens)": [1] * (R + 1),
    f"1 x 8 + {R - 1} x 1": [8] + [1] * (R - 1),
    f"{R + 7} x 1 (as many tokens)": [1] * (R + 7),
    f"{Q} x 8 (spread) + {R - Q} x 1": [8 if i % (R // Q) == 0 else 1 for i in range(R)],
    f"{R + 7 * Q} x 1 (as many tokens)": [1] * (R + 7 * Q),
    f"{R // 2} x 8 (spread) + {R - R // 2} x 1": [8 if i % 2 == 0 else 1 for i in range(R)],
    f"{R} x 8": [8] * R,
    f"{R} x 1 again": [1] * R,
}
for name, lengths in cases.items():
    print(f"{name:>26}: {sum(lengths):4d} tokens {median_ms(lengths):8.2f} ms")
