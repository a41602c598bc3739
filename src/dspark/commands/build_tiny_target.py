"""``dspark build-tiny-target``: rebuild the embedded tiny target offline (DESIGN §11)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dspark.commands.argtypes import positive_int
from dspark.commands.loading import set_threads
from dspark.commands.options import add_threads


def add_build_tiny_args(p: argparse.ArgumentParser) -> None:
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


def main_build_tiny_target(args: argparse.Namespace) -> int:
    """Rebuild the embedded tiny target: offline corpus, BPE tokenizer, Qwen3 training (DESIGN §11)."""
    import dataclasses

    from dspark.presets.tiny import assets_dir
    from dspark.tiny.build import TinyTargetConfig, build_tiny_target

    set_threads(args.threads)
    cfg = TinyTargetConfig()
    if args.steps:
        cfg = dataclasses.replace(cfg, steps=args.steps)
    out = args.out or assets_dir() / "tiny_target"
    prompts = args.prompts_out or assets_dir() / "prompts"
    manifest = build_tiny_target(out, prompts, cfg)
    print(json.dumps({k: manifest[k] for k in ("parameters", "build_seconds", "held_out_loss")}, indent=2))
    return 0
