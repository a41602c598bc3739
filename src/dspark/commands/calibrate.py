"""``dspark calibrate``: the call into :func:`dspark.pipeline.calibrate.calibrate_drafter`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dspark.commands.eval import (
    eval_config,
    load_benchmarks,
    load_eval_target,
    setup_threads,
)
from dspark.commands.loading import drafter_folder
from dspark.drafters.registry import TRAINABLE
from dspark.errors import DsparkError
from dspark.formats.folder import read_config
from dspark.pipeline.calibrate import calibrate_drafter


def _drafter_folder(spec: str, target=None) -> Path:
    folder = drafter_folder(spec, target)
    if not (folder / "config.json").is_file():
        raise DsparkError(f"{spec!r} is not a drafter folder; only a trained drafter can be calibrated")
    raw = read_config(folder)
    if not raw.get("enable_confidence_head"):
        raise DsparkError(f"{folder}: this drafter has no confidence head, so there is nothing to calibrate")
    return folder


def main_calibrate(args: argparse.Namespace) -> int:
    """Run ``dspark calibrate`` (arguments: :mod:`~dspark.commands.args.calibrate`)."""
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
