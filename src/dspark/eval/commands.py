"""``dspark eval``: arguments and the glue from them to :func:`dspark.eval.runner.run_eval`.

Everything that can be refused is refused before any decoding: the target, each
drafter (:func:`dspark.drafters.registry.build_drafter` validates a folder against the
target; :func:`~dspark.drafters.folder.load_drafter` catches a drafter trained for
another target of the same shape), every benchmark file and every prompt's length.
The argument helpers here are shared with ``dspark calibrate`` and ``dspark sweep``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

import torch

from dspark.argtypes import json_object
from dspark.errors import DsparkError

log = logging.getLogger(__name__)

DEFAULT_BENCH = "math,code,chat"


# -- shared arguments -------------------------------------------------------------------------


def add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target", default=None, help="HF model folder or hub id (default: the embedded tiny target)"
    )
    p.add_argument(
        "--device",
        default=None,
        help="torch device of the target and drafters (default: cuda if present, else cpu)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def add_decoding_args(
    p: argparse.ArgumentParser, *, bench: str = DEFAULT_BENCH, max_tokens: int = 256
) -> None:
    p.add_argument(
        "--bench",
        default=bench,
        help="comma-separated benchmarks: built-in sets (math, code, chat) or JSONL paths "
        "(the file name, e.g. gsm8k.jsonl, picks DeepSpec's prompt cap and the paper's domain)",
    )
    p.add_argument("--limit", type=int, default=None, help="prompts per benchmark (default: DeepSpec's caps)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--max-tokens", type=int, default=max_tokens, help="most new tokens per answer")
    p.add_argument(
        "--block-size", type=int, default=None, help="drafts per round (default: each drafter's γ)"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="base seed; every method gets the same per-prompt seeds"
    )
    p.add_argument("--multi-turn", action="store_true", help="answer every turn, not only the first")
    p.add_argument(
        "--strict",
        action="store_true",
        help="a prompt longer than the target's context is an error (default: skipped and counted)",
    )
    p.add_argument(
        "--on-bad-line",
        choices=["stop", "skip"],
        default="stop",
        help="a broken benchmark line stops the run (default) or is skipped with a warning; both name it",
    )
    p.add_argument(
        "--template-kwargs",
        type=json_object,
        default="{}",
        help="JSON passed to the chat template, e.g. '{\"enable_thinking\": false}'",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def setup_threads(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)


def load_target(args: argparse.Namespace):
    from dspark.presets.tiny import resolve_target
    from dspark.targets import TargetAdapter

    return TargetAdapter.from_pretrained(resolve_target(args.target), device=args.device)


def parse_drafter_specs(text: str) -> dict[str, str]:
    """``"dspark,dflash=runs/a/drafter"`` → ``{"dspark": "dspark", "dflash": "runs/a/drafter"}``.

    An unnamed folder is labelled by its name (its parent's for a run's ``drafter/``).
    """
    specs: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        label, sep, spec = item.partition("=")
        if not sep:
            spec = item
            path = Path(item)
            label = (
                item if len(path.parts) == 1 else (path.parent.name if path.name == "drafter" else path.name)
            )
        if not label or not spec:
            raise DsparkError(f"bad drafter {item!r}: expected NAME, PATH or LABEL=NAME_OR_PATH")
        if label in specs:
            raise DsparkError(f"two drafters are labelled {label!r}; name them with LABEL=PATH")
        specs[label] = spec
    if not specs:
        raise DsparkError("no drafters given")
    return specs


def load_drafters(specs: dict[str, str], target) -> dict:
    """Every drafter of ``specs`` for ``target``, validated (module docstring)."""
    from dspark.drafters.registry import build_drafter

    # load_drafter refuses a drafter made for another target (fields, keys, shared weights).
    return {label: build_drafter(spec, target) for label, spec in specs.items()}


def load_benchmarks(args: argparse.Namespace, *, skip: int = 0):
    from dspark.eval.benchmarks import load_benchmark

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
    from dspark.eval.runner import EvalConfig

    template_kwargs = args.template_kwargs
    if args.temperature < 0:
        raise DsparkError(f"--temperature must be >= 0, got {args.temperature}")
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
    )


# -- dspark eval ------------------------------------------------------------------------------


def add_eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--drafters",
        required=True,
        help="comma-separated drafters: shipped names (dspark, dflash, eagle3, ngram), drafter folders, "
        "or LABEL=NAME_OR_PATH",
    )
    add_decoding_args(p)
    add_target_args(p)
    p.add_argument("--no-baseline", action="store_true", help="skip plain decoding (no speedup figures)")
    p.add_argument("--out", type=Path, required=True, help="folder for results.json, the plots and report.md")


def main_eval(args: argparse.Namespace) -> int:
    """Speculative decoding of benchmarks with several drafters: τ, acceptance per position, speedup."""
    from dspark.eval.report import write_eval_report
    from dspark.eval.runner import run_eval

    setup_threads(args)
    config = eval_config(args, baseline=not args.no_baseline)
    specs = parse_drafter_specs(args.drafters)
    benchmarks = load_benchmarks(args)  # the cheap checks first
    target = load_target(args)
    drafters = load_drafters(specs, target)
    result = run_eval(target, drafters, benchmarks, config)
    meta = {"target": args.target or "tiny", "drafters": specs}
    report = write_eval_report(result, args.out, meta)
    print(f"{'drafter':<16}{'benchmark':<20}{'tau':>7}{'tok/s':>9}{'speedup':>9}")
    for r in result.rows:
        speedup = f"{r.speedup:.2f}x" if r.speedup is not None else "-"
        print(f"{r.drafter[:15]:<16}{r.benchmark[:19]:<20}{r.tau:>7.2f}{r.tokens_per_s:>9.1f}{speedup:>9}")
    print(f"report: {report}")
    return 0


# -- dspark sweep block-size / depth ------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _add_sweep_common(p: argparse.ArgumentParser) -> None:
    from dspark.training.commands import TINY_CORPUS

    p.add_argument(
        "--data",
        nargs="+",
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
    add_target_args(p)
    p.add_argument(
        "--out", type=Path, required=True, help="folder: runs/, eval/, sweep.json, the plot, report.md"
    )


def add_sweep_block_size_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lengths",
        type=_int_list,
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
    p.add_argument("--layers", type=_int_list, default=[1, 2, 5], help="DSpark depths")
    p.add_argument("--baseline-layers", type=int, default=5, help="depth of the DFlash baseline")
    p.add_argument("--gamma", type=int, default=7, help="drafts per round (γ) of every variant")
    _add_sweep_common(p)


def _run_sweep_command(args: argparse.Namespace, kind: str, variants_of) -> int:
    from dspark.eval.sweeps import SweepTraining, run_sweep, write_sweep_report
    from dspark.training.commands import TINY_CORPUS
    from dspark.training.data import read_jsonl, tokenize_records

    setup_threads(args)
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
    target = load_target(args)
    records: list[dict] = []
    for spec in args.data:
        if spec == TINY_CORPUS:
            from dspark.tiny.corpus import training_records

            records += training_records()
        else:
            records += read_jsonl(spec)
    dataset = tokenize_records(records[: args.data_limit], target.tokenizer, max_length=args.max_length)
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
    from dspark.eval.sweeps import block_size_variants

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    return _run_sweep_command(
        args, "block-size", lambda: block_size_variants(args.lengths, methods, args.layers)
    )


def main_sweep_depth(args: argparse.Namespace) -> int:
    """Depth ablation (paper Fig. 3): train DSpark at several depths and a DFlash baseline, compare τ."""
    from dspark.eval.sweeps import depth_variants

    return _run_sweep_command(
        args, "depth", lambda: depth_variants(args.layers, args.baseline_layers, args.gamma)
    )
