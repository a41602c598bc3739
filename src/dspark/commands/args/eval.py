"""``dspark eval``: its arguments and ``--help`` text; the run is :mod:`dspark.commands.eval`."""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.commands.argtypes import non_negative_int, prompt_sets
from dspark.commands.options import (
    add_device,
    add_drafters,
    add_dtype,
    add_force,
    add_no_progress,
    add_target,
    add_template_kwargs,
    add_threads,
)

DEFAULT_BENCH = "math,code,chat"


# -- shared arguments -------------------------------------------------------------------------


def add_target_args(p: argparse.ArgumentParser, *, dtype: bool = True) -> None:
    """``--target``, ``--device``, ``--dtype`` and ``--threads``: where the target runs.

    ``dtype=False`` for verbs that train with the target (they keep the trainer's dtype).
    """
    add_target(p)
    add_device(p)
    if dtype:
        add_dtype(p)
    add_threads(p)


def add_decoding_args(
    p: argparse.ArgumentParser, *, bench: str = DEFAULT_BENCH, max_tokens: int = 256
) -> None:
    p.add_argument(
        "--bench",
        type=prompt_sets,
        default=bench,
        help="comma-separated benchmarks: built-in sets (math, code, chat) or JSONL paths "
        "(the file name, e.g. gsm8k.jsonl, picks DeepSpec's prompt cap and the paper's domain)",
    )
    p.add_argument("--limit", type=int, default=None, help="prompts per benchmark (default: DeepSpec's caps)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--max-tokens", type=int, default=max_tokens, help="most new tokens per answer")
    p.add_argument(
        "--block-size", type=int, default=None, help="drafts per round (default: each drafter's γ)"
    )
    p.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        help="base seed; every method gets the same per-prompt seeds",
    )
    p.add_argument("--multi-turn", action="store_true", help="answer every turn, not only the first")
    p.add_argument(
        "--strict",
        action="store_true",
        help="a prompt longer than the target's context is an error (default: skipped and counted)",
    )
    p.add_argument(
        "--on-bad-line",
        choices=["stop", "skip"],
        default="stop",
        help="a broken benchmark line stops the run (default) or is skipped with a warning; both name it",
    )
    add_template_kwargs(p)
    add_no_progress(p)


# -- dspark eval ------------------------------------------------------------------------------


def add_eval_args(p: argparse.ArgumentParser) -> None:
    """Speculative decoding of benchmarks with several drafters: τ, acceptance per position, speedup."""
    add_drafters(p, labels=True)
    add_decoding_args(p)
    add_target_args(p)
    p.add_argument("--no-baseline", action="store_true", help="skip plain decoding (no speedup figures)")
    p.add_argument(
        "--no-payoff-control",
        action="store_true",
        help="speed columns from the pass that verifies every draft (default: a second decode of "
        "each answer under the payoff controller, as the commands serve; the τ tables verify every "
        "draft either way)",
    )
    p.add_argument("--out", type=Path, required=True, help="folder for results.json, the plots and report.md")
    add_force(p, "a report in --out that no earlier `dspark eval` there wrote")
