"""``dspark bench target``: how structured the target's own answers are.

The measuring itself lives in :mod:`dspark.eval.target_report`.
"""

from __future__ import annotations

import argparse
import json

from dspark.commands.loading import load_inference_target
from dspark.eval.target_report import target_report


def main_bench_target(args: argparse.Namespace) -> int:
    """Run ``dspark bench target`` (arguments: :mod:`~dspark.commands.args.bench_target`)."""
    target = load_inference_target(args.target, args.dtype)
    reports = target_report(target, limit=args.limit, max_tokens=args.max_tokens, samples=args.samples)
    print(json.dumps([r.as_dict() for r in reports], indent=2))
    for r in reports:
        for prompt, answer in r.samples:
            print(f"\n### {r.domain}\n**Prompt:** {prompt}\n\n**Answer:**\n{answer}")
    return 0
