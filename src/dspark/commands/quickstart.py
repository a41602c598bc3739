"""``dspark quickstart``: the call into :func:`dspark.pipeline.quickstart.run_quickstart`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dspark.errors import DsparkError
from dspark.pipeline.presets import quickstart_plan
from dspark.pipeline.quickstart import run_quickstart
from dspark.pipeline.quickstart.report import headline_lines


def main_quickstart(args: argparse.Namespace) -> int:
    """Run ``dspark quickstart`` (arguments: :mod:`~dspark.commands.args.quickstart`)."""
    if args.shipped is not None and not args.shipped.is_dir():
        raise DsparkError(f"--shipped {args.shipped}: no such folder")
    plan = quickstart_plan(args.fast)
    out = args.out or Path("runs") / ("quickstart-fast" if args.fast else "quickstart")
    report = run_quickstart(
        plan,
        out,
        progress=not args.no_progress,
        announce=lambda line: print(line, file=sys.stderr, flush=True),
        dtype=args.dtype,
        shipped_root=args.shipped,
        force=args.force,
    )
    for line in headline_lines(json.loads((report.parent / "summary.json").read_text())):
        print(line)
    print(f"report: {report}")
    return 0
