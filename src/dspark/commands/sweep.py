"""``dspark sweep block-size|depth``: the paper's ablations (Figs. 3 and 4) at equal training budgets.

Trains every variant with :func:`dspark.pipeline.sweeps.run_sweep` (resumable per variant),
evaluates them on the same prompts and seeds and writes ``sweep.json``, the plot and
``report.md``. Decoding arguments and their checks are ``dspark eval``'s.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.commands.argtypes import TINY_CORPUS, int_list, training_data
from dspark.commands.eval import (
    add_decoding_args,
    add_target_args,
    eval_config,
    load_benchmarks,
    load_eval_target,
    setup_threads,
)
from dspark.commands.loading import training_records
from dspark.commands.options import add_force
from dspark.errors import DsparkError
from dspark.output_folders import claim_outputs


def _add_sweep_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        nargs="+",
        type=training_data,
        default=[TINY_CORPUS],
        help=f"training data: JSONL conversation files, or '{TINY_CORPUS}' (the tiny target's corpus)",
    )
    p.add_argument("--data-limit", type=int, default=None, help="use only the first N training records")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per variant")
    p.add_argument("--batch-size", type=int, default=8, help="global batch per step")
    p.add_argument("--micro-batch-size", type=int, default=2, help="sequences per forward")
    p.add_argument("--lr", type=float, default=6e-4, help="peak learning rate")
    p.add_argument("--num-anchors", type=int, default=512, help="blocks per sequence")
    p.add_argument("--max-length", type=int, default=1024, help="tokens per training sequence")
    add_decoding_args(p, max_tokens=128)
    add_target_args(p, dtype=False)  # it trains: the trainer's dtype
    p.add_argument(
        "--out", type=Path, required=True, help="folder: runs/, eval/, sweep.json, the plot, report.md"
    )
    add_force(
        p, "what --out holds under a sweep's names (runs/, eval/, report.md, ...) when no sweep wrote it"
    )


def add_sweep_block_size_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lengths",
        type=int_list,
        default=[4, 8, 12, 16],
        help="draft lengths γ+1 (the paper's x axis; γ = length − 1 drafts per round)",
    )
    p.add_argument(
        "--methods", default="dspark,dflash", help="comma-separated: dspark (Markov head), dspark-rnn, dflash"
    )
    p.add_argument(
        "--layers", type=int, default=None, help="drafter layers for every variant (default: preset)"
    )
    _add_sweep_common(p)


def add_sweep_depth_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int_list, default=[1, 2, 5], help="DSpark depths")
    p.add_argument("--baseline-layers", type=int, default=5, help="depth of the DFlash baseline")
    p.add_argument("--gamma", type=int, default=7, help="drafts per round (γ) of every variant")
    _add_sweep_common(p)


def _run_sweep_command(args: argparse.Namespace, kind: str, variants_of) -> int:
    from dspark.data.samples import tokenize_records
    from dspark.pipeline.sweeps import OUTPUTS, SweepTraining, run_sweep, write_sweep_report

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
    """Block-size ablation (paper Fig. 4): train DSpark and DFlash per draft length, compare τ."""
    from dspark.pipeline.sweeps import block_size_variants

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    return _run_sweep_command(
        args, "block-size", lambda: block_size_variants(args.lengths, methods, args.layers)
    )


def main_sweep_depth(args: argparse.Namespace) -> int:
    """Depth ablation (paper Fig. 3): train DSpark at several depths and a DFlash baseline, compare τ."""
    from dspark.pipeline.sweeps import depth_variants

    return _run_sweep_command(
        args, "depth", lambda: depth_variants(args.layers, args.baseline_layers, args.gamma)
    )
