"""The ``dspark`` command line: one table of verbs (:data:`COMMANDS`), the one place that
names modules lazily.

A verb is two modules of the same name: ``commands/args/VERB.py``, its arguments and its
``--help`` text (the docstring of ``add_*_args``), light enough to build at once, and
``commands/VERB.py``, its ``main_*``, which imports what it runs at the top. ``dspark --help``
imports no command module; ``dspark VERB --help`` and an argument error import VERB's
arguments alone; ``dspark VERB ...`` imports its run module once the arguments are parsed.
No other function body imports a dspark module (``tests/unit/test_function_imports.py`` names
the two exceptions and why). Every option's default is shown. User mistakes (a bad path, a bad
number, a prompt too long) end with a one-line ``dspark: error: ...`` and exit status 2, never a
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dspark.commands.argtypes import positive_int
from dspark.commands.options import HelpFormatter, Parser
from dspark.errors import DsparkError
from dspark.threads import apply_threads

AddArgs = Callable[[argparse.ArgumentParser], None]
Main = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    """One verb: the name of its two modules, ``dspark.commands.args.<module>`` (``add_args``) and
    ``dspark.commands.<module>`` (``main``), each imported only when needed, and the one line
    ``dspark --help`` lists it with (the first line of ``add_args``'s docstring, which a test pins)."""

    module: str
    add_args: str
    main: str
    summary: str

    def arguments(self) -> AddArgs:
        """The function that adds the verb's arguments; its docstring is the verb's ``--help``."""
        return getattr(importlib.import_module(f"dspark.commands.args.{self.module}"), self.add_args)

    def runner(self) -> Main:
        """The verb's ``main``, whose module imports torch and the library: call it after parsing."""
        return getattr(importlib.import_module(f"dspark.commands.{self.module}"), self.main)


# The one table of verbs. ``dspark --help`` imports no command module; ``dspark VERB --help``
# imports VERB's arguments alone; ``dspark VERB ...`` its run module after parsing.
COMMANDS: dict[str, Command] = {
    "quickstart": Command(
        "quickstart",
        "add_quickstart_args",
        "main_quickstart",
        "The whole pipeline on the embedded tiny target: data → train → calibrate → eval → serve → report.",
    ),
    "generate": Command(
        "generate",
        "add_generate_args",
        "main_generate",
        "Generate an answer with speculative decoding; τ and tokens/s go to stderr.",
    ),
    "build-tiny-target": Command(
        "build_tiny_target",
        "add_build_tiny_args",
        "main_build_tiny_target",
        "Rebuild the embedded tiny target: offline corpus, BPE tokenizer, Qwen3 training (DESIGN §11).",
    ),
    "train": Command(
        "train",
        "add_train_args",
        "main_train",
        "Train a drafter against a frozen target (one process, or many under torchrun).",
    ),
    "campaign": Command(
        "campaign",
        "add_campaign_args",
        "main_campaign",
        "From a target to converged, evaluated drafters: regenerate → feature cache → train ×3 → eval.",
    ),
    "bench decode": Command(
        "bench_speed",
        "add_bench_decode_args",
        "main_bench_decode",
        "Batch-1 greedy tokens/s of HF generate vs our loop with each drafter, as ratios from one run.",
    ),
    "bench matrix": Command(
        "bench_speed",
        "add_bench_matrix_args",
        "main_bench_matrix",
        "Prompt set x drafter x concurrency -> speedup over plain decoding: payoff control vs static.",
    ),
    "bench target": Command(
        "bench_target",
        "add_bench_target_args",
        "main_bench_target",
        "How structured the target's greedy answers are on the built-in math/code/chat prompts.",
    ),
    "bench markov-overhead": Command(
        "bench_costs",
        "add_bench_overhead_args",
        "main_bench_overhead",
        "Cost of DSpark's sequential (Markov/RNN) sampling loop as a share of a round (goal ≤ 1.3%).",
    ),
    "bench round": Command(
        "bench_costs",
        "add_bench_round_args",
        "main_bench_round",
        "Where a greedy batch-1 round's time goes (bench/round_cost.py), per dtype; the sequential",
    ),
    "bench tree": Command(
        "bench_tree",
        "add_bench_tree_args",
        "main_bench_tree",
        "τ, drafts verified per round and batch-1 tokens/s of chains and token trees, per drafter.",
    ),
    "profile": Command(
        "profile",
        "add_profile_args",
        "main_profile",
        "Profile SPS(B), target steps per second for a forward of B tokens, and save the table.",
    ),
    "serve": Command(
        "serve",
        "add_serve_args",
        "main_serve",
        "Serve a target with batched speculative decoding over an OpenAI-compatible HTTP API.",
    ),
    "bench serve": Command(
        "bench_serve",
        "add_bench_serve_args",
        "main_bench_serve",
        "Closed-loop clients against the real server: aggregate throughput vs per-user tokens/s per policy.",
    ),
    "bench startup": Command(
        "bench_tools",
        "add_bench_startup_args",
        "main_bench_startup",
        "Start-up seconds of `dspark --help` and of an argument error, beside the interpreter alone",
    ),
    "bench llamacpp": Command(
        "bench_tools",
        "add_bench_llamacpp_args",
        "main_bench_llamacpp",
        "dspark's drafters inside llama.cpp's own binaries: τ and tokens/s over llama.cpp's plain",
    ),
    "bench llamacpp-plot": Command(
        "bench_tools",
        "add_bench_llamacpp_plot_args",
        "main_bench_llamacpp_plot",
        "The figure of `dspark bench llamacpp` runs: speed over llama.cpp's plain decoding per target",
    ),
    "data prompts": Command(
        "data",
        "add_prompts_args",
        "main_prompts",
        "Collect prompt sets into train (and eval) JSONL files: dedup, domain tags, seeded split.",
    ),
    "data regenerate": Command(
        "data",
        "add_regenerate_args",
        "main_regenerate",
        "Have the target answer every prompt, turn by turn, in-process or over OpenAI-compatible HTTP.",
    ),
    "data cache": Command(
        "data",
        "add_cache_args",
        "main_cache",
        "Build the offline feature cache: target features of every training token, sharded, checksummed.",
    ),
    "data estimate": Command(
        "data",
        "add_estimate_args",
        "main_estimate",
        "Bytes per token and total size of a feature cache, from the numbers or a model's config.",
    ),
    "eval": Command(
        "eval",
        "add_eval_args",
        "main_eval",
        "Speculative decoding of benchmarks with several drafters: τ, acceptance per position, speedup.",
    ),
    "calibrate": Command(
        "calibrate",
        "add_calibrate_args",
        "main_calibrate",
        "Fit STS temperatures on held-out rounds, write them into the drafter, report ECE/AUC/Brier.",
    ),
    "export": Command(
        "export",
        "add_export_args",
        "main_export",
        "Export a drafter for vLLM, SGLang or HF, validated by re-loading it; SERVE.md has the commands.",
    ),
    "sweep block-size": Command(
        "sweep",
        "add_sweep_block_size_args",
        "main_sweep_block_size",
        "Block-size ablation (paper Fig. 4): train DSpark and DFlash per draft length, compare τ.",
    ),
    "sweep depth": Command(
        "sweep",
        "add_sweep_depth_args",
        "main_sweep_depth",
        "Depth ablation (paper Fig. 3): train DSpark at several depths and a DFlash baseline, compare τ.",
    ),
}

GLOBAL_WITH_VALUE = ("--threads",)  # global options that take a value (``main``'s scan skips it)


def selected(argv: Sequence[str]) -> str:
    """The verb ``argv`` names (``"bench decode"``), a group alone (``"bench"``), or ``""``."""
    words, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in GLOBAL_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            words.append(arg)
            if len(words) == 2:
                break
    if " ".join(words) in COMMANDS:
        return " ".join(words)
    if words and (words[0] in COMMANDS or any(name.startswith(words[0] + " ") for name in COMMANDS)):
        return words[0]
    return ""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every verb (``only`` None), or of the verb ``only`` names with the others
    listed by their summary alone (their modules not imported)."""
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
    for name, command in COMMANDS.items():
        group, _, verb = name.rpartition(" ")
        if group and group not in groups:  # "bench decode" → `dspark bench decode`
            gp = sub.add_parser(group, help=f"{group} subcommands", formatter_class=HelpFormatter)
            groups[group] = gp.add_subparsers(dest=f"{group}_command", required=True, metavar="SUBCOMMAND")
        summary = command.summary.replace("%", "%%")  # argparse formats help with %
        if only is not None and name != only:
            (groups[group] if group else sub).add_parser(verb, help=summary, formatter_class=HelpFormatter)
            continue
        add_args = command.arguments()
        doc = (add_args.__doc__ or "").strip().replace("%", "%%")
        p = (groups[group] if group else sub).add_parser(
            verb, help=summary, description=doc, formatter_class=HelpFormatter
        )
        add_args(p)
        p.set_defaults(_command=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(selected(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    apply_threads(args.torch_threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bar on every command
    try:
        return args._command.runner()(args)
    except DsparkError as e:
        # User mistakes: one line, no traceback (a library bug is not caught here).
        parser.exit(2, f"dspark: error: {e}\n")
    except KeyboardInterrupt:
        # What was saved and how to resume was logged by the interrupted work itself.
        print("dspark: interrupted", file=sys.stderr)
        return 130
