"""``dspark campaign``: its arguments and ``--help`` text; the run is :mod:`dspark.commands.campaign`."""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.commands.options import add_force, add_no_progress
from dspark.pipeline.presets import METHODS, campaign_plans
from dspark.user_cache import cache_root


def default_root() -> Path:
    """Campaign state lives in the user cache, outside any checkout: ``~/.cache/dspark/campaigns``."""

    return cache_root() / "campaigns"


def add_campaign_args(p: argparse.ArgumentParser) -> None:
    """From a target to converged, evaluated drafters: regenerate → feature cache → train ×3 → eval.

    The target answers its own training prompts; the feature cache pays the target
    forward once for every drafter and epoch; DFlash, DSpark and Eagle3 train with equal
    budgets until the epoch budget or until expected τ rises < 1 % over the last 20 % of
    the steps; the three are evaluated with n-gram against plain decoding. Every stage
    resumes after a kill (training from its last checkpoint) and none repeats finished
    work. Run it in the background with one thread: `dspark --threads 1 campaign`.
    With more cores, start one such process per core on the same --out with the methods
    in different orders (`--methods eagle3,dflash,dspark`): a stage runs in one process at
    a time, the others wait for it and skip it once it is done.
    `--sweeps depth,block-size` then trains and evaluates the paper's ablations (Figs. 3
    and 4) from the same feature cache, at the campaign's budget or `--sweep-epochs`.
    """
    p.add_argument(
        "--target",
        default="tiny",
        choices=sorted(campaign_plans()),
        help="the target whose drafters to train",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"campaign folder (default: {default_root()}/<target>); rerunning into it resumes",
    )
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="drafter methods to train, in this order (each with the same budget)",
    )
    p.add_argument(
        "--epochs", type=float, default=None, help="training budget in epochs (default: the plan's)"
    )
    p.add_argument(
        "--sweeps",
        default="",
        help="also run the paper's ablations at this budget, after the evaluation: depth (Fig. 3: "
        "DSpark 1/2/5 layers vs a 5-layer DFlash), block-size (Fig. 4: draft length 4/8/12/16 for "
        "DSpark and DFlash); comma-separated, each variant its own resumable training stage "
        "(reports in <out>/sweeps/<kind>/)",
    )
    p.add_argument(
        "--sweep-epochs",
        type=float,
        default=None,
        help="training budget of each sweep variant (default: --epochs; then the campaign's own "
        "DSpark and DFlash are the variants they equal)",
    )
    p.add_argument("--prompts", type=int, default=None, help="regenerate only the first N training prompts")
    p.add_argument("--eval-prompts", type=int, default=None, help="prompts per evaluation set")
    p.add_argument("--eval-max-tokens", type=int, default=None, help="tokens per evaluation answer")
    p.add_argument(
        "--status", action="store_true", help="print where the campaign in --out stands (runs nothing)"
    )
    add_no_progress(p, help="no progress bars (stage lines still print)")
    add_force(
        p, "what --out holds under the campaign's names (data/, train/, eval/, ...) when no campaign wrote it"
    )
