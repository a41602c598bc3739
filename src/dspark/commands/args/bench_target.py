"""``dspark bench target``: its arguments and ``--help`` text; the run is
:mod:`dspark.commands.bench_target`."""

from __future__ import annotations

import argparse

from dspark.commands.argtypes import positive_int
from dspark.commands.options import add_dtype, add_target


def add_bench_target_args(p: argparse.ArgumentParser) -> None:
    """How structured the target's greedy answers are on the built-in math/code/chat prompts."""
    add_target(p)
    add_dtype(p)
    p.add_argument("--limit", type=positive_int, default=40, help="prompts per built-in domain")
    p.add_argument("--max-tokens", type=positive_int, default=384, help="tokens per answer")
    p.add_argument("--samples", type=int, default=3, help="sample answers to print per domain")
