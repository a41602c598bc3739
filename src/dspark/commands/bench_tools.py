"""``dspark bench startup``, ``dspark bench llamacpp`` and ``dspark bench llamacpp-plot``.

The measuring lives in :mod:`dspark.bench.startup` and :mod:`dspark.bench.llamacpp_serve`.
"""

from __future__ import annotations

import argparse
import json
import logging

from dspark.bench.llamacpp_serve import LlamacppConfig, markdown, plot_runs, run_llamacpp
from dspark.bench.startup import table, time_startup
from dspark.errors import DsparkError


def main_bench_startup(args: argparse.Namespace) -> int:
    """Run ``dspark bench startup`` (arguments: :mod:`~dspark.commands.args.bench_tools`)."""

    result = time_startup(args.src, args.repeats)
    where = args.src or "installed"
    print(f"sources: {where}   repeats: {result.repeats}   load average: {result.load_average:.2f}")
    print(table(result))
    return 0


def main_bench_llamacpp(args: argparse.Namespace) -> int:
    """Run ``dspark bench llamacpp`` (arguments: :mod:`~dspark.commands.args.bench_tools`)."""
    if not (args.export / "dspark_export.json").is_file():
        raise DsparkError(f"--export {args.export}: not a `dspark export --format gguf` folder")
    logging.getLogger("dspark.bench").setLevel(logging.INFO)
    config = LlamacppConfig(
        quants=args.quants,
        threads=tuple(args.threads),
        temps=args.temps,
        p_mins=args.p_mins,
        sets=args.sets,
        limit=args.limit,
        max_tokens=args.max_tokens,
        block_size=args.block_size,
        dspark_engine=args.dspark_engine,
        dspark_dtype=args.dspark_dtype,
    )
    run = run_llamacpp(args.bin, args.export, config)
    print(markdown(run["results"]))
    if args.json:
        args.json.write_text(json.dumps(run, default=str, indent=1))
    return 0


def main_bench_llamacpp_plot(args: argparse.Namespace) -> int:
    """Run ``dspark bench llamacpp-plot`` (arguments: :mod:`~dspark.commands.args.bench_tools`)."""
    plot_runs([json.loads(path.read_text()) for path in args.runs], args.out)
    print(args.out)
    return 0
