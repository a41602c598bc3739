"""``dspark build-tiny-target``: its arguments and ``--help`` text; the run is
:mod:`dspark.commands.build_tiny_target`."""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.commands.argtypes import positive_int
from dspark.commands.options import add_threads


def add_build_tiny_args(p: argparse.ArgumentParser) -> None:
    """Rebuild the embedded tiny target: offline corpus, BPE tokenizer, Qwen3 training (DESIGN §11)."""
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output model folder (default: the package's embedded tiny target)",
    )
    p.add_argument(
        "--prompts-out",
        type=Path,
        default=None,
        help="folder for the built-in prompt sets (default: the package's)",
    )
    p.add_argument("--steps", type=positive_int, default=None, help="training steps (default: the preset's)")
    add_threads(p)
