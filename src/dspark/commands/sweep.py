"""``dspark sweep block-size|depth``: the paper's ablations (Figs. 3 and 4) at equal training budgets.

Trains every variant with :func:`dspark.pipeline.sweeps.run_sweep` (resumable per variant),
evaluates them on the same prompts and seeds and writes ``sweep.json``, the plot and
``report.md``. Decoding arguments and their checks are ``dspark eval``'s.
"""

from __future__ import annotations

import argparse

from dspark.commands.eval import (
    eval_config,
    load_benchmarks,
    load_eval_target,
    setup_threads,
)
from dspark.commands.loading import training_records
from dspark.data.samples import tokenize_records
from dspark.errors import DsparkError
from dspark.output_folders import claim_outputs
from dspark.pipeline.sweeps import (
    OUTPUTS,
    SweepTraining,
    block_size_variants,
    depth_variants,
    run_sweep,
    write_sweep_report,
)


def _run_sweep_command(args: argparse.Namespace, kind: str, variants_of) -> int:
    setup_threads(args)
    claim_outputs(args.out, OUTPUTS, command="sweep", force=args.force, write=False)
    config = eval_config(args, baseline=False)
    if min(args.steps, args.batch_size, args.micro_batch_size, args.num_anchors, args.max_length) < 1:
        raise DsparkError(
            "--steps, --batch-size, --micro-batch-size, --num-anchors, --max-length must be >= 1"
        )
    try:
        variants = variants_of()
    except ValueError as e:
        raise DsparkError(str(e)) from None
    benchmarks = load_benchmarks(args)
    target = load_eval_target(args)
    records = training_records(args.data)[: args.data_limit]
    dataset = tokenize_records(records, target.tokenizer, max_length=args.max_length)
    if len(dataset) == 0:
        raise DsparkError("no training record has supervised (assistant) tokens")
    training = SweepTraining(
        steps=args.steps,
        batch_size=args.batch_size,
        micro_batch_size=args.micro_batch_size,
        lr=args.lr,
        num_anchors=args.num_anchors,
        seed=args.seed,
        progress=not args.no_progress,
    )
    claim_outputs(args.out, OUTPUTS, command="sweep", force=args.force)
    sweep = run_sweep(
        kind, target, variants, dataset, benchmarks, args.out, training=training, eval_config=config
    )
    meta = {
        "target": args.target or "tiny",
        "training": f"{args.steps} steps × {args.batch_size} sequences, lr {args.lr}",
        "drafters": {v.label: str(args.out / "runs") for v in variants},
    }
    report = write_sweep_report(sweep, args.out, meta)
    for p in sweep.points:
        print(f"{p.label:<18}{p.benchmark[:19]:<20}{p.tau:>7.2f}")
    print(f"report: {report}")
    return 0


def main_sweep_block_size(args: argparse.Namespace) -> int:
    """Run ``dspark sweep block-size`` (arguments: :mod:`~dspark.commands.args.sweep`)."""
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    return _run_sweep_command(
        args, "block-size", lambda: block_size_variants(args.lengths, methods, args.layers)
    )


def main_sweep_depth(args: argparse.Namespace) -> int:
    """Run ``dspark sweep depth`` (arguments: :mod:`~dspark.commands.args.sweep`)."""
    return _run_sweep_command(
        args, "depth", lambda: depth_variants(args.layers, args.baseline_layers, args.gamma)
    )
