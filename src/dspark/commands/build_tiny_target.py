"""``dspark build-tiny-target``: rebuild the embedded tiny target offline (DESIGN §11)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from dspark.commands.loading import set_threads
from dspark.presets.tiny import assets_dir
from dspark.tiny.build import TinyTargetConfig, build_tiny_target


def main_build_tiny_target(args: argparse.Namespace) -> int:
    """Run ``dspark build-tiny-target`` (arguments: :mod:`~dspark.commands.args.build_tiny_target`)."""
    set_threads(args.threads)
    cfg = TinyTargetConfig()
    if args.steps:
        cfg = dataclasses.replace(cfg, steps=args.steps)
    out = args.out or assets_dir() / "tiny_target"
    prompts = args.prompts_out or assets_dir() / "prompts"
    manifest = build_tiny_target(out, prompts, cfg)
    print(json.dumps({k: manifest[k] for k in ("parameters", "build_seconds", "held_out_loss")}, indent=2))
    return 0
