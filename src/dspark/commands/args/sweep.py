"""``dspark sweep block-size|depth``: their arguments and ``--help`` texts; the run is
:mod:`dspark.commands.sweep`."""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.commands.args.eval import (
    add_decoding_args,
    add_target_args,
)
from dspark.commands.argtypes import TINY_CORPUS, int_list, training_data
from dspark.commands.options import add_force


def _add_sweep_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        nargs="+",
        type=training_data,
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
    add_target_args(p, dtype=False)  # it trains: the trainer's dtype
    p.add_argument(
        "--out", type=Path, required=True, help="folder: runs/, eval/, sweep.json, the plot, report.md"
    )
    add_force(
        p, "what --out holds under a sweep's names (runs/, eval/, report.md, ...) when no sweep wrote it"
    )


def add_sweep_block_size_args(p: argparse.ArgumentParser) -> None:
    """Block-size ablation (paper Fig. 4): train DSpark and DFlash per draft length, compare τ."""
    p.add_argument(
        "--lengths",
        type=int_list,
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
    """Depth ablation (paper Fig. 3): train DSpark at several depths and a DFlash baseline, compare τ."""
    p.add_argument("--layers", type=int_list, default=[1, 2, 5], help="DSpark depths")
    p.add_argument("--baseline-layers", type=int, default=5, help="depth of the DFlash baseline")
    p.add_argument("--gamma", type=int, default=7, help="drafts per round (γ) of every variant")
    _add_sweep_common(p)
