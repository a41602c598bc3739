"""``dspark bench serve``: closed-loop clients against the real server, per policy.

Every point is measured in the same process as the others (the machine is noisy); the
measuring itself lives in :mod:`dspark.bench.serve_load`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from dspark import conditions as run_conditions
from dspark.bench.serve_load import bench_serve, plot_load
from dspark.commands.loading import load_inference_target
from dspark.data.prompts import load_prompts
from dspark.formats.build import build_drafter
from dspark.output_folders import claim_outputs

_OUTPUTS = ("results.json", "throughput_vs_per_user.png")


def main_bench_serve(args: argparse.Namespace) -> int:
    """Run ``dspark bench serve`` (arguments: :mod:`~dspark.commands.args.bench_serve`)."""
    claim = dict(names=_OUTPUTS, command="bench serve", force=args.force)
    claim_outputs(Path(args.out), **claim, write=False)  # before the (long) benchmark
    concurrencies = sorted(set(args.concurrency))
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    sets = [[p.turns[0] for p in load_prompts(spec.strip(), args.limit)] for spec in args.prompts.split(",")]
    # Interleaved (math, code, chat, math, ...): every point, whatever its size, sees the same mix.
    prompts = [p for group in itertools.zip_longest(*sets) for p in group if p is not None]
    target = load_inference_target(args.target, args.dtype)
    drafter = build_drafter(args.drafter, target)
    conditions = run_conditions.for_target(target)

    def show(p) -> None:
        print(
            f"{p.policy:<14}c={p.concurrency:<4}{p.throughput:>9.1f} tok/s  {p.per_user:>7.1f} tok/s/user  "
            f"τ {p.tau:.2f}  verify {p.verify_budget:.2f}",
            file=sys.stderr,
            flush=True,
        )

    points = bench_serve(
        target,
        drafter,
        policies,
        concurrencies,
        prompts,
        max_tokens=args.max_tokens,
        requests_per_client=args.requests_per_client,
        min_requests=args.min_requests,
        block_size=args.block_size,
        max_seq_len=args.max_seq_len,
        payoff=not args.no_payoff_control,
        choose_proposer=not args.no_proposer_choice,
        progress=show,
    )
    out = Path(args.out)
    claim_outputs(out, **claim)
    settings = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    conditions = conditions.ended()
    if conditions.warning():
        print(f"warning: {conditions.warning()}", file=sys.stderr)
    results = {
        "settings": settings,
        "conditions": conditions.as_dict(),
        "points": [p.as_dict() for p in points],
    }
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    plot = plot_load(points, out / "throughput_vs_per_user.png")
    print(json.dumps({"results": str(out / "results.json"), "plot": str(plot)}))
    return 0
