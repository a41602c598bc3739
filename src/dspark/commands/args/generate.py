"""``dspark generate``: its arguments and ``--help`` text; the run is :mod:`dspark.commands.generate`."""

from __future__ import annotations

import argparse

from dspark.commands.argtypes import positive_int
from dspark.commands.options import (
    add_block_size,
    add_drafter,
    add_dtype,
    add_payoff,
    add_sampling,
    add_target,
)


def add_generate_args(p: argparse.ArgumentParser) -> None:
    """Generate an answer with speculative decoding; τ and tokens/s go to stderr.

    Exits 1 when the engine failed the request (``finish_reason`` "error", also with ``--json``).
    """
    p.add_argument(
        "--prompt", required=True, help="the user message; applied through the target's chat template"
    )
    add_target(p)
    add_dtype(p)
    add_drafter(p, default="ngram", purpose="ngram is prompt lookup, none plain decoding")
    add_sampling(p)
    p.add_argument("--max-tokens", type=positive_int, default=256, help="most tokens to generate")
    add_block_size(p, help="most drafts verified per round (γ)")
    add_payoff(p)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template to the prompt")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (text, num_tokens, tau, tokens_per_s, finish_reason; error when it "
        "failed) instead of streaming",
    )
