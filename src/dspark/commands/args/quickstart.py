"""``dspark quickstart``: its arguments and ``--help`` text; the run is
:mod:`dspark.commands.quickstart`."""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.commands.options import add_dtype, add_force, add_no_progress


def add_quickstart_args(p: argparse.ArgumentParser) -> None:
    """The whole pipeline on the embedded tiny target: data → train → calibrate → eval → serve → report.

    Regenerates answers to the tiny target's training prompts with the target itself,
    trains DFlash, DSpark and Eagle3 with equal budgets (online target features),
    fits STS temperatures for DSpark, evaluates all three against plain decoding on the
    built-in math/code/chat prompts, runs a short serving sweep behind the real HTTP
    server, and writes <out>/report.md with the tables and plots. Shipped drafters with a
    SHIPPED.json record are evaluated beside the trained ones, and the report estimates
    from their learning curves how many more steps the trained ones would need to reach
    them. No network, no GPU.
    """
    p.add_argument(
        "--fast",
        action="store_true",
        help="a smoke run with tiny budgets (< 3 minutes on 2 CPU cores); the default run takes < 20",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="run folder (default: runs/quickstart, or runs/quickstart-fast with --fast); "
        "rerunning into it resumes the finished stages",
    )
    p.add_argument(
        "--shipped",
        type=Path,
        default=None,
        metavar="DIR",
        help="shipped drafters to compare with, laid out like the package's (<target>/<method>/ and "
        "<target>/SHIPPED.json, as scripts/ship_drafters.py --dest writes them; default: the package's)",
    )
    add_dtype(p)
    add_no_progress(p, help="no progress bars (stage lines still print)")
    add_force(
        p,
        "what --out holds under the run's names (data/, train/, report.md, ...) when no quickstart wrote it",
    )
