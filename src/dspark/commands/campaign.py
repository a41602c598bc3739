"""``dspark campaign``: the call into :func:`dspark.pipeline.campaign.pipeline.run_campaign`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from dspark.commands.args.campaign import default_root
from dspark.errors import DsparkError
from dspark.pipeline.campaign.pipeline import run_campaign
from dspark.pipeline.campaign.progress import status
from dspark.pipeline.campaign.sweeps import parse_sweeps
from dspark.pipeline.presets import METHODS, campaign_plans


def main_campaign(args: argparse.Namespace) -> int:
    """Run ``dspark campaign`` (arguments: :mod:`~dspark.commands.args.campaign`)."""
    out = args.out or default_root() / args.target
    if args.status:
        if not out.is_dir():
            raise DsparkError(
                f"no campaign at {out}; start one with `dspark campaign --target {args.target}`"
            )
        print(json.dumps(status(out), indent=1))
        return 0
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise DsparkError(f"unknown --methods {unknown or args.methods!r}; choose from {', '.join(METHODS)}")
    try:
        sweeps = parse_sweeps(args.sweeps)
    except ValueError as e:
        raise DsparkError(str(e)) from None
    if args.sweep_epochs is not None and not args.sweep_epochs > 0:
        raise DsparkError(f"--sweep-epochs must be > 0, got {args.sweep_epochs}")
    plan = campaign_plans()[args.target]
    changes = {
        k: v
        for k, v in (
            ("epochs", args.epochs),
            ("prompts", args.prompts),
            ("eval_prompts", args.eval_prompts),
            ("eval_max_tokens", args.eval_max_tokens),
            ("sweep_epochs", args.sweep_epochs),
        )
        if v is not None
    }
    plan = dataclasses.replace(plan, **changes)
    summary = run_campaign(
        plan,
        out,
        methods=methods,
        sweeps=sweeps,
        progress=not args.no_progress,
        announce=lambda line: print(line, file=sys.stderr, flush=True),
        force=args.force,
    )
    trained = {
        m: {k: t[k] for k in ("steps", "epochs", "expected_tau")} for m, t in summary["trained"].items()
    }
    print(
        json.dumps({"out": str(out), "trained": trained, "report": str(out / "eval" / "report.md")}, indent=1)
    )
    return 0
