"""``dspark bench decode|matrix``: their arguments and ``--help`` texts; the run is
:mod:`dspark.commands.bench_speed`."""

from __future__ import annotations

import argparse

from dspark.commands.argtypes import int_list, non_negative_float, positive_int, prompt_sets
from dspark.commands.options import add_block_size, add_drafters, add_dtype, add_payoff, add_target


def add_bench_decode_args(p: argparse.ArgumentParser) -> None:
    """Batch-1 greedy tokens/s of HF generate vs our loop with each drafter, as ratios from one run."""
    add_target(p)
    add_dtype(p)
    p.add_argument(
        "--bench",
        type=prompt_sets,
        default="code",
        help="comma-separated prompt sets: built-in names (math, code, chat), shipped benchmark subsets "
        "(gsm8k, humaneval, mt-bench: 20 prompts each) or JSONL paths",
    )
    p.add_argument("--limit", type=positive_int, default=20, help="prompts per set")
    add_drafters(p, default="none,ngram")
    p.add_argument("--max-tokens", type=positive_int, default=128, help="tokens per answer")
    add_block_size(p, help="most drafts per round (γ)")
    p.add_argument("--no-hf", action="store_true", help="skip Hugging Face generate")
    p.add_argument(
        "--hf-prompt-lookup",
        type=int,
        default=0,
        help="also run HF generate with prompt_lookup_num_tokens=N (0: off)",
    )
    p.add_argument(
        "--hf-assistant",
        default=None,
        help="also run HF assisted generation with this assistant model folder (same tokenizer)",
    )
    p.add_argument(
        "--engine-policies",
        default="",
        help="also decode each drafter through the batched engine (one slot) with these comma-separated "
        "verification policies, as methods DRAFTER@POLICY (e.g. prefix,fixed)",
    )
    add_payoff(p)
    p.add_argument(
        "--temperature", type=non_negative_float, default=0.0, help="0 = greedy (default); > 0 samples"
    )
    p.add_argument("--verify-k", default="8", help="comma-separated k for the verify-k / decode-1 cost ratio")
    p.add_argument(
        "--strict",
        action="store_true",
        help="a prompt that does not fit the context is an error (default: skipped)",
    )
    p.add_argument("--json", action="store_true", help="print JSON rows instead of a table")


def add_bench_matrix_args(p: argparse.ArgumentParser) -> None:
    """Prompt set x drafter x concurrency -> speedup over plain decoding: payoff control vs static."""
    add_target(p)
    add_dtype(p)
    p.add_argument(
        "--prompts",
        type=prompt_sets,
        default="code,math,chat",
        help="comma-separated prompt sets: built-in names (math, code, chat), shipped benchmark subsets "
        "(gsm8k, humaneval, mt-bench) or JSONL paths",
    )
    p.add_argument(
        "--limit", type=positive_int, default=4, help="prompts per set (cycled up to the concurrency)"
    )
    add_drafters(p, default="ngram,dspark,dflash,eagle3")
    p.add_argument(
        "--concurrency",
        type=int_list,
        default=[1, 4, 16, 64],
        help="comma-separated KV slots = requests at once",
    )
    p.add_argument(
        "--requests", type=positive_int, default=4, help="requests per cell at least (at low concurrency)"
    )
    p.add_argument("--max-tokens", type=positive_int, default=32, help="tokens per answer")
    add_block_size(p)
    p.add_argument(
        "--static",
        default="fixed",
        help="comma-separated static policies (every round drafts, no payoff control) to compare with",
    )
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=1,
        help="run plain decoding and every method in turn this many times per cell and sum their "
        "seconds (a drifting machine load then weighs on baseline and methods alike); each repeat "
        "ends with plain decoding again, whose disagreement with the first is printed as the "
        "cell's noise (A/A); each cell's speedup is printed ± the standard error of its repeats' "
        "speedups",
    )
    p.add_argument("--json", action="store_true", help="print the cells and the goal check as JSON")
