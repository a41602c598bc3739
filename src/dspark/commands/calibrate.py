"""``dspark calibrate``: arguments and the call into :func:`dspark.pipeline.calibrate.calibrate_drafter`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dspark.commands.argtypes import drafter_spec
from dspark.commands.eval import (
    add_decoding_args,
    add_target_args,
    eval_config,
    load_benchmarks,
    load_eval_target,
    setup_threads,
)
from dspark.commands.loading import drafter_folder
from dspark.commands.options import add_force
from dspark.drafters.registry import TRAINABLE
from dspark.errors import DsparkError


def add_calibrate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--drafter",
        required=True,
        type=drafter_spec,
        help=f"a drafter with a confidence head: a registered trained drafter ({', '.join(TRAINABLE)}; "
        "shipped for the tiny target, only dspark has the head) or a drafter folder",
    )
    add_decoding_args(p)
    add_target_args(p)
    p.add_argument(
        "--skip",
        type=int,
        default=0,
        help="skip the first N prompts of each benchmark (keep calibration prompts apart from `dspark "
        "eval --limit N`)",
    )
    p.add_argument(
        "--holdout-fraction",
        type=float,
        default=0.25,
        help="share of the prompts kept out of the fit to report before/after metrics on (0: in-sample)",
    )
    p.add_argument("--bins", type=int, default=20, help="equal-width ECE bins")
    p.add_argument(
        "--save-to",
        type=Path,
        default=None,
        help="write a calibrated copy of the drafter folder here (default: update the drafter folder itself)",
    )
    p.add_argument("--dry-run", action="store_true", help="fit and report, but write no temperatures")
    p.add_argument(
        "--out", type=Path, required=True, help="folder for calibration.json, the plot and the report"
    )
    add_force(
        p, "a report in --out, or a drafter folder at --save-to, that no earlier `dspark calibrate` wrote"
    )


def _drafter_folder(spec: str, target=None) -> Path:
    from dspark.formats.folder import read_config

    folder = drafter_folder(spec, target)
    if not (folder / "config.json").is_file():
        raise DsparkError(f"{spec!r} is not a drafter folder; only a trained drafter can be calibrated")
    raw = read_config(folder)
    if not raw.get("enable_confidence_head"):
        raise DsparkError(f"{folder}: this drafter has no confidence head, so there is nothing to calibrate")
    return folder


def main_calibrate(args: argparse.Namespace) -> int:
    """Fit STS temperatures on held-out rounds, write them into the drafter, report ECE/AUC/Brier."""
    from dspark.pipeline.calibrate import calibrate_drafter

    setup_threads(args)
    if not 0.0 <= args.holdout_fraction < 1.0:
        raise DsparkError(f"--holdout-fraction must be in [0, 1), got {args.holdout_fraction}")
    if args.skip < 0 or args.bins < 1:
        raise DsparkError("--skip must be >= 0 and --bins >= 1")
    config = eval_config(args, baseline=False)

    # A folder is checked before the target loads; a shipped name needs the target to resolve.
    shipped = args.drafter in TRAINABLE
    if shipped and args.save_to is None and not args.dry_run:
        # A shipped drafter is part of the installed package: never rewrite it in place.
        raise DsparkError(
            f"--drafter {args.drafter} is the shipped drafter, part of the package; pass --save-to DIR "
            "for a calibrated copy (then --drafter DIR), or --dry-run to fit and report only"
        )
    folder = None if shipped else _drafter_folder(args.drafter)
    benchmarks = load_benchmarks(args, skip=args.skip)
    target = load_eval_target(args)
    folder = folder or _drafter_folder(args.drafter, target)
    summary = calibrate_drafter(
        target,
        folder,
        benchmarks,
        config,
        args.out,
        holdout_fraction=args.holdout_fraction,
        bins=args.bins,
        seed=args.seed,
        save_to=args.save_to,
        dry_run=args.dry_run,
        force=args.force,
    )
    print(
        json.dumps(
            {
                k: summary[k]
                for k in (
                    "temperatures",
                    "written_to",
                    "fit_rounds",
                    "report_rounds",
                    "mean_ece_before",
                    "mean_ece_after",
                )
            },
            indent=2,
        )
    )
    return 0
