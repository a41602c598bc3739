"""``dspark bench markov-overhead|round``: their arguments and ``--help`` texts; the run is
:mod:`dspark.commands.bench_costs`."""

from __future__ import annotations

import argparse

from dspark.commands.argtypes import positive_int
from dspark.commands.options import add_block_size, add_drafter, add_dtype, add_target


def add_bench_overhead_args(p: argparse.ArgumentParser) -> None:
    """Cost of DSpark's sequential (Markov/RNN) sampling loop as a share of a round (goal ≤ 1.3%)."""
    add_target(p)
    add_dtype(p)
    add_drafter(p, default="dspark", purpose="a drafter with a sequential (Markov/RNN) head", with_none=False)
    p.add_argument("--batch", default="1,8", help="comma-separated request counts")
    p.add_argument("--repeats", type=positive_int, default=20, help="timings per part (the median is kept)")


def add_bench_round_args(p: argparse.ArgumentParser) -> None:
    """Where a greedy batch-1 round's time goes (bench/round_cost.py), per dtype; the sequential
    loop before it was vectorised is timed beside today's."""
    add_target(p)
    p.add_argument(
        "--dtypes",
        default="float32,bfloat16",
        help="comma-separated dtypes to load the target in, one after the other in this process",
    )
    add_drafter(p, default="dspark", purpose="a drafter with a sequential (Markov/RNN) head", with_none=False)
    p.add_argument(
        "--untrained",
        action="store_true",
        help="time an untrained DSpark drafter of the shipped one's shape (2 layers, rank 64) built "
        "for --target (timings do not depend on the weights; for targets without a shipped drafter)",
    )
    p.add_argument("--bench", default="math", help="built-in prompt set of the engine decodes")
    p.add_argument("--limit", type=positive_int, default=3, help="prompts decoded through the engine")
    p.add_argument("--max-tokens", type=positive_int, default=48, help="tokens per engine answer")
    add_block_size(p, help="drafts per round (γ)")
    p.add_argument("--repeats", type=positive_int, default=15, help="timings per part (the median is kept)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
