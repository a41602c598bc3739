"""``dspark calibrate``: its arguments and ``--help`` text; the run is :mod:`dspark.commands.calibrate`."""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.commands.args.eval import (
    add_decoding_args,
    add_target_args,
)
from dspark.commands.argtypes import drafter_spec
from dspark.commands.options import add_force
from dspark.drafters.registry import TRAINABLE


def add_calibrate_args(p: argparse.ArgumentParser) -> None:
    """Fit STS temperatures on held-out rounds, write them into the drafter, report ECE/AUC/Brier."""
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
