"""``dspark bench markov-overhead`` and ``dspark bench round``: where a round's time goes.

Each times its parts against the rest of a round measured in the same process (the
machine is noisy); the measuring itself lives in :mod:`dspark.bench.overhead` and
:mod:`dspark.bench.round_cost`.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from dspark import conditions as run_conditions
from dspark.bench.overhead import sequential_head_overhead
from dspark.bench.round_cost import round_breakdown, untrained_dspark
from dspark.commands.loading import load_inference_target, load_target
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.errors import DsparkError
from dspark.formats.build import build_drafter
from dspark.targets.dtype import DTYPES


def main_bench_overhead(args: argparse.Namespace) -> int:
    """Run ``dspark bench markov-overhead`` (arguments: :mod:`~dspark.commands.args.bench_costs`)."""
    target = load_inference_target(args.target, args.dtype)
    drafter = build_drafter(args.drafter, target)
    if getattr(drafter, "markov_head", None) is None:
        raise DsparkError(f"{args.drafter!r} has no sequential head to measure")
    prompts = [prompt_ids(target.tokenizer, p) for d in ("math", "code", "chat") for p in load_prompts(d, 22)]
    conditions = run_conditions.for_target(target)
    print(
        f"{'R':>4}{'backbone ms':>13}{'parallel ms':>13}{'sequential ms':>15}"
        f"{'verify ms':>11}{'overhead':>10}"
    )
    for R in (int(x) for x in args.batch.split(",")):
        t = sequential_head_overhead(target, drafter, prompts[:R], repeats=args.repeats)
        print(
            f"{R:>4}{t.backbone_s * 1e3:>13.2f}{t.parallel_sampling_s * 1e3:>13.2f}"
            f"{t.sequential_sampling_s * 1e3:>15.2f}{t.verify_s * 1e3:>11.2f}{t.overhead:>10.2%}"
        )
    conditions = conditions.ended()
    print(f"run conditions: {conditions.describe()}")
    if conditions.warning():
        print(f"warning: {conditions.warning()}", file=sys.stderr)
    return 0


def main_bench_round(args: argparse.Namespace) -> int:
    """Run ``dspark bench round`` (arguments: :mod:`~dspark.commands.args.bench_costs`)."""
    names = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in names if d not in DTYPES]
    if unknown or not names:
        raise DsparkError(f"--dtypes takes {', '.join(DTYPES)}; got {args.dtypes!r}")
    rows, conditions = [], None
    for name in names:
        target = load_target(args.target, dtype=DTYPES[name])
        conditions = conditions or run_conditions.for_target(target)
        drafter = (
            untrained_dspark(target, args.block_size)
            if args.untrained
            else build_drafter(args.drafter, target)
        )
        if getattr(drafter, "markov_head", None) is None:
            raise DsparkError(f"{args.drafter!r} has no sequential head to measure")
        prompts = [prompt_ids(target.tokenizer, p) for p in load_prompts(args.bench, args.limit)]
        with torch.no_grad():
            rows.append(
                round_breakdown(
                    target,
                    drafter,
                    prompts,
                    block_size=args.block_size,
                    max_tokens=args.max_tokens,
                    repeats=args.repeats,
                )
            )
    conditions = conditions.ended()
    if args.json:
        print(json.dumps({"rows": [r.as_dict() for r in rows], "conditions": conditions.as_dict()}, indent=2))
    else:
        parts = [
            ("decode_step_s", "target decode step (1 token)"),
            ("verify_s", "target verify (1 + γ tokens)"),
            ("sampling_s", "target-side sampling + verification"),
            ("backbone_s", "drafter backbone (layers + LM head)"),
            ("loop_before_s", "DSpark loop, before it was vectorised"),
            ("loop_s", "DSpark loop, now"),
            ("propose_s", "propose, now"),
            ("engine_forward_s", "engine step: target forward"),
            ("engine_draft_s", "engine step: propose"),
            ("engine_update_s", "engine step: drafter update"),
            ("engine_bookkeeping_s", "engine step: bookkeeping"),
        ]
        print(f"{'ms per part':<40}" + "".join(f"{r.dtype:>12}" for r in rows))
        for key, label in parts:
            print(f"{label:<40}" + "".join(f"{getattr(r, key) * 1e3:>12.3f}" for r in rows))
        print(f"{'loop speed-up (before / now)':<40}" + "".join(f"{r.loop_speedup:>11.2f}x" for r in rows))
        print(f"run conditions: {conditions.describe()}")
    if conditions.warning():
        print(f"warning: {conditions.warning()}", file=sys.stderr)
    return 0
