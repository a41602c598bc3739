"""The ``dspark`` command line: a table of verbs, each an ``add_*_args`` / ``main_*`` pair.

The pairs live in :mod:`dspark.commands`, one module per verb; every ``main_*``
docstring is its ``--help`` text, and every option's default is shown. User mistakes
(a bad path, a bad number, a prompt too long) end with a one-line ``dspark: error: ...``
and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

from dspark.commands import (
    bench_costs,
    bench_serve,
    bench_speed,
    bench_target,
    bench_tools,
    bench_tree,
    build_tiny_target,
    calibrate,
    campaign,
    data,
    export,
    generate,
    profile,
    quickstart,
    serve,
    sweep,
    train,
)
from dspark.commands import eval as eval_
from dspark.commands.argtypes import positive_int
from dspark.commands.options import HelpFormatter, Parser
from dspark.errors import DsparkError

AddArgs = Callable[[argparse.ArgumentParser], None]
Main = Callable[[argparse.Namespace], int]

COMMANDS: dict[str, tuple[AddArgs, Main]] = {
    "quickstart": (quickstart.add_quickstart_args, quickstart.main_quickstart),
    "generate": (generate.add_generate_args, generate.main_generate),
    "build-tiny-target": (build_tiny_target.add_build_tiny_args, build_tiny_target.main_build_tiny_target),
    "train": (train.add_train_args, train.main_train),
    "campaign": (campaign.add_campaign_args, campaign.main_campaign),
    "bench decode": (bench_speed.add_bench_decode_args, bench_speed.main_bench_decode),
    "bench matrix": (bench_speed.add_bench_matrix_args, bench_speed.main_bench_matrix),
    "bench target": (bench_target.add_bench_target_args, bench_target.main_bench_target),
    "bench markov-overhead": (bench_costs.add_bench_overhead_args, bench_costs.main_bench_overhead),
    "bench round": (bench_costs.add_bench_round_args, bench_costs.main_bench_round),
    "bench tree": (bench_tree.add_bench_tree_args, bench_tree.main_bench_tree),
    "profile": (profile.add_profile_args, profile.main_profile),
    "serve": (serve.add_serve_args, serve.main_serve),
    "bench serve": (bench_serve.add_bench_serve_args, bench_serve.main_bench_serve),
    "bench startup": (bench_tools.add_bench_startup_args, bench_tools.main_bench_startup),
    "bench llamacpp": (bench_tools.add_bench_llamacpp_args, bench_tools.main_bench_llamacpp),
    "bench llamacpp-plot": (bench_tools.add_bench_llamacpp_plot_args, bench_tools.main_bench_llamacpp_plot),
    "data prompts": (data.add_prompts_args, data.main_prompts),
    "data regenerate": (data.add_regenerate_args, data.main_regenerate),
    "data cache": (data.add_cache_args, data.main_cache),
    "data estimate": (data.add_estimate_args, data.main_estimate),
    "eval": (eval_.add_eval_args, eval_.main_eval),
    "calibrate": (calibrate.add_calibrate_args, calibrate.main_calibrate),
    "export": (export.add_export_args, export.main_export),
    "sweep block-size": (sweep.add_sweep_block_size_args, sweep.main_sweep_block_size),
    "sweep depth": (sweep.add_sweep_depth_args, sweep.main_sweep_depth),
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dspark",
        description="Lossless speculative decoding: train, evaluate and serve drafters.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        dest="torch_threads",
        help="torch CPU threads (default: OMP_NUM_THREADS if set, else the free cores: the cores "
        "minus the 1-minute load average, at least 1; see README 'Threads')",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for name, (add_args, fn) in COMMANDS.items():
        doc = (fn.__doc__ or "").strip().replace("%", "%%")  # argparse formats help with %
        group, _, verb = name.rpartition(" ")
        if group and group not in groups:  # "bench decode" → `dspark bench decode`
            gp = sub.add_parser(group, help=f"{group} subcommands", formatter_class=HelpFormatter)
            groups[group] = gp.add_subparsers(dest=f"{group}_command", required=True, metavar="SUBCOMMAND")
        p = (groups[group] if group else sub).add_parser(
            verb, help=doc.splitlines()[0] if doc else None, description=doc, formatter_class=HelpFormatter
        )
        add_args(p)
        p.set_defaults(_fn=fn)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from dspark.threads import apply_threads

    apply_threads(args.torch_threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bar on every command
    try:
        return args._fn(args)
    except DsparkError as e:
        # User mistakes: one line, no traceback (a library bug is not caught here).
        parser.exit(2, f"dspark: error: {e}\n")
    except KeyboardInterrupt:
        # What was saved and how to resume was logged by the interrupted work itself.
        print("dspark: interrupted", file=sys.stderr)
        return 130
