"""``dspark bench serve``: its arguments and ``--help`` text; the run is
:mod:`dspark.commands.bench_serve`."""

from __future__ import annotations

import argparse

from dspark.commands.argtypes import int_list, positive_int, prompt_sets
from dspark.commands.options import add_block_size, add_drafter, add_dtype, add_force, add_payoff, add_target


def add_bench_serve_args(p: argparse.ArgumentParser) -> None:
    """Closed-loop clients against the real server: aggregate throughput vs per-user tokens/s per policy."""
    add_target(p)
    add_dtype(p)
    add_drafter(p, default="dflash", purpose="drafter of every policy but 'none'")
    p.add_argument(
        "--policies",
        default="fixed:1,fixed,threshold:0.5,prefix,prefix-async,none",
        help="comma-separated verification policies; 'none' = plain decoding",
    )
    p.add_argument(
        "--concurrency",
        type=int_list,
        default=[1, 2, 4, 8, 16, 32, 64],
        help="comma-separated closed-loop client counts",
    )
    p.add_argument(
        "--prompts",
        type=prompt_sets,
        default="math,code,chat",
        help="comma-separated prompt sets (built-in or JSONL)",
    )
    p.add_argument("--limit", type=positive_int, default=64, help="prompts per set")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="tokens per answer")
    p.add_argument(
        "--requests-per-client", type=positive_int, default=2, help="requests each client sends (at least)"
    )
    p.add_argument(
        "--min-requests", type=positive_int, default=12, help="requests per point at least (low concurrency)"
    )
    add_block_size(p)
    p.add_argument("--max-seq-len", type=positive_int, default=512, help="tokens per KV slot")
    add_payoff(p)
    p.add_argument("--out", default="runs/bench_serve", help="folder for results.json and the plot")
    add_force(p, "results.json or the plot in --out when no `dspark bench serve` wrote them")
