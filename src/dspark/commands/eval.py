"""``dspark eval``: the glue from its arguments to :func:`dspark.eval.runner.run_eval`.

Everything that can be refused is refused before any decoding: the target, each
drafter (:func:`dspark.formats.build.build_drafter` validates a folder against the
target; :func:`~dspark.formats.folder.load_drafter` catches a drafter trained for
another target of the same shape), every benchmark file and every prompt's length.
The checks of the decoding arguments here (the arguments are :mod:`dspark.commands.args.eval`'s)
are shared with ``dspark calibrate`` and ``dspark sweep``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from dspark.commands.loading import (
    load_drafters,
    load_inference_target,
    load_target,
    parse_drafter_specs,
    set_threads,
)
from dspark.errors import DsparkError
from dspark.eval.benchmarks import load_benchmark
from dspark.eval.report import report_files, write_eval_report
from dspark.eval.runner import EvalConfig, run_eval
from dspark.output_folders import claim_outputs

log = logging.getLogger(__name__)


def setup_threads(args: argparse.Namespace) -> None:
    set_threads(args.threads)


def load_eval_target(args: argparse.Namespace):
    if not hasattr(args, "dtype"):  # a training verb: the trainer's dtype (fp32 on the CPU)
        return load_target(args.target, device=args.device)
    return load_inference_target(args.target, args.dtype, device=args.device)


def load_benchmarks(args: argparse.Namespace, *, skip: int = 0):
    if args.limit is not None and args.limit < 1:
        raise DsparkError(f"--limit must be >= 1, got {args.limit}")
    benches = []
    for spec in filter(None, (s.strip() for s in args.bench.split(","))):
        limit = None if args.limit is None else args.limit + skip
        bench = load_benchmark(spec, limit=limit, on_bad_line=args.on_bad_line)
        if skip:
            bench = dataclasses.replace(bench, prompts=bench.prompts[skip:])
            if not bench.prompts:
                raise DsparkError(f"benchmark {spec!r} has no prompts left after skipping {skip}")
        if any(b.name == bench.name for b in benches):
            raise DsparkError(f"two benchmarks are named {bench.name!r}; rename one of the files")
        benches.append(bench)
    if not benches:
        raise DsparkError("no benchmarks given")
    return benches


def eval_config(args: argparse.Namespace, *, baseline: bool):
    template_kwargs = args.template_kwargs
    if not 0 <= args.temperature < float("inf"):  # NaN too: found only when results.json is written
        raise DsparkError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.max_tokens < 1:
        raise DsparkError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.block_size is not None and args.block_size < 1:
        raise DsparkError(f"--block-size must be >= 1, got {args.block_size}")
    return EvalConfig(
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        multi_turn=args.multi_turn,
        seed=args.seed,
        block_size=args.block_size,
        baseline=baseline,
        template_kwargs=template_kwargs,
        progress=not args.no_progress,
        strict=args.strict,
        payoff_speed=not getattr(args, "no_payoff_control", False),
    )


def main_eval(args: argparse.Namespace) -> int:
    """Run ``dspark eval`` (arguments: :mod:`~dspark.commands.args.eval`)."""
    setup_threads(args)
    config = eval_config(args, baseline=not args.no_baseline)
    specs = parse_drafter_specs(args.drafters)
    claim = dict(names=report_files(specs), command="eval", force=args.force)
    claim_outputs(args.out, **claim, write=False)  # before the (long) decoding
    benchmarks = load_benchmarks(args)  # the cheap checks first
    target = load_eval_target(args)
    drafters = load_drafters(specs, target)
    result = run_eval(target, drafters, benchmarks, config)
    meta = {"target": args.target or "tiny", "drafters": specs}
    claim_outputs(args.out, **claim)
    report = write_eval_report(result, args.out, meta)
    print(f"{'drafter':<16}{'benchmark':<20}{'tau':>7}{'tok/s':>9}{'speedup':>9}")
    for r in result.rows:
        speedup = f"{r.speedup:.2f}x" if r.speedup is not None else "-"
        print(f"{r.drafter[:15]:<16}{r.benchmark[:19]:<20}{r.tau:>7.2f}{r.tokens_per_s:>9.1f}{speedup:>9}")
    if result.conditions is not None and result.conditions.warning():
        print(f"warning: {result.conditions.warning()}", file=sys.stderr)
    print(f"report: {report}")
    return 0
