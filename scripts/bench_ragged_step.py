"""What a few verifying requests cost a step of many decoding ones (issue 17).

One flat target forward (``targets/flat.py``) over 64 requests with ``START`` tokens each in
their slots: all decoding one token, one of them verifying 8, four spread over the slots
verifying 8, and all verifying 8. Thread CPU time, medians of 7, one thread, fp32. Before
single-token and multi-token runs attended in separate groups, every row of a step was
padded to its longest run.

    python scripts/bench_ragged_step.py tiny 400
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
R, START = 64, int(sys.argv[2]) if len(sys.argv) > 2 else 400
store = KVStore.for_target(target, num_slots=R, capacity=START + 16)


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


cases = {
    "64 x 1": [1] * R,
    "1 x 8 + 63 x 1": [8] + [1] * (R - 1),
    "4 x 8 (spread) + 60 x 1": [8 if i % 16 == 0 else 1 for i in range(R)],
    "64 x 8": [8] * R,
    "64 x 1 again": [1] * R,
}
for name, lengths in cases.items():
    print(f"{name:>26}: {sum(lengths):4d} tokens {median_ms(lengths):8.2f} ms")
