"""``dspark bench target``: how structured the target's own answers are.

The measuring itself lives in :mod:`dspark.eval.target_report`.
"""

from __future__ import annotations

import argparse
import json

from dspark.commands.argtypes import positive_int
from dspark.commands.loading import load_inference_target
from dspark.commands.options import add_dtype, add_target


def add_bench_target_args(p: argparse.ArgumentParser) -> None:
    add_target(p)
    add_dtype(p)
    p.add_argument("--limit", type=positive_int, default=40, help="prompts per built-in domain")
    p.add_argument("--max-tokens", type=positive_int, default=384, help="tokens per answer")
    p.add_argument("--samples", type=int, default=3, help="sample answers to print per domain")


def main_bench_target(args: argparse.Namespace) -> int:
    """How structured the target's greedy answers are on the built-in math/code/chat prompts."""
    from dspark.eval.target_report import target_report

    target = load_inference_target(args.target, args.dtype)
    reports = target_report(target, limit=args.limit, max_tokens=args.max_tokens, samples=args.samples)
    print(json.dumps([r.as_dict() for r in reports], indent=2))
    for r in reports:
        for prompt, answer in r.samples:
            print(f"\n### {r.domain}\n**Prompt:** {prompt}\n\n**Answer:**\n{answer}")
    return 0
