"""``dspark export``: write a drafter folder that vLLM, SGLang or HF code loads (DESIGN §5.4)."""

from __future__ import annotations

import argparse
import json

from dspark.commands.loading import drafter_folder
from dspark.errors import DsparkError
from dspark.formats.build import build_drafter
from dspark.formats.export import DTYPES, SERVE_NAME, export_drafter, read_sps_table
from dspark.formats.folder import EXPORT_MANIFEST
from dspark.presets.tiny import resolve_target
from dspark.protocols import TrainableDrafter
from dspark.targets import TargetAdapter


def export_dtype(fmt: str, dtype: str | None) -> str:
    """The weight dtype of an export: the one asked for, else fp16 for llama.cpp's GGUF (its
    bf16 kernels ran a draft 2-3x slower than fp16 on CPUs, BENCHMARKS) and bf16 for the rest."""
    return dtype or ("fp16" if fmt == "gguf" else "bf16")


def main_export(args: argparse.Namespace) -> int:
    """Run ``dspark export`` (arguments: :mod:`~dspark.commands.args.export`)."""
    sps_table = read_sps_table(args.sps_table) if args.sps_table is not None else None
    target_name = resolve_target(args.target)
    target = TargetAdapter.from_pretrained(target_name)
    drafter = build_drafter(args.drafter, target)
    if not isinstance(drafter, TrainableDrafter):
        raise DsparkError(f"{args.drafter!r} has no weights to export; give a trained drafter or its folder")
    out = export_drafter(
        drafter,
        target,
        args.out,
        fmt=args.fmt,
        dtype=DTYPES[export_dtype(args.fmt, args.dtype)],
        source=drafter_folder(args.drafter, target),
        target_name=target_name,
        force=args.force,
        sps_table=sps_table,
    )
    manifest = json.loads((out / EXPORT_MANIFEST).read_text())
    print(json.dumps({"out": str(out), "serve": str(out / SERVE_NAME), **manifest}, indent=2))
    return 0
