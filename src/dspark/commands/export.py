"""``dspark export``: write a drafter folder that vLLM, SGLang or HF code loads (SPEC §5.4)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dspark.commands.options import add_target
from dspark.drafters.registry import TRAINABLE
from dspark.errors import DsparkError

FORMATS = ("vllm", "sglang", "hf")  # drafters/export.py checks that it writes exactly these
DTYPE_NAMES = ("bf16", "fp16", "fp32")  # the keys of drafters.export.DTYPES


def add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        required=True,
        choices=FORMATS,
        dest="fmt",
        help="vllm / sglang: the layout those engines load (DeepSpec's for DSpark/DFlash, "
        "LlamaForCausalLMEagle3 for Eagle3); hf: our own folder layout",
    )
    p.add_argument(
        "--drafter",
        required=True,
        metavar="NAME_OR_FOLDER",
        help=f"a trained drafter: {', '.join(TRAINABLE)} (shipped for the tiny target) or a drafter folder",
    )
    p.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="folder to write (must not exist or be empty)"
    )
    add_target(
        p, help="HF model folder or hub id the drafter was trained for (default: the embedded tiny target)"
    )
    p.add_argument(
        "--dtype", choices=sorted(DTYPE_NAMES), default="bf16", help="weight dtype (default: bf16)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing drafter folder at --out")


def main_export(args: argparse.Namespace) -> int:
    """Export a drafter for vLLM, SGLang or HF, validated by re-loading it; SERVE.md has the commands."""
    from dspark.commands.loading import drafter_folder
    from dspark.drafters.export import DTYPES, SERVE_NAME, export_drafter
    from dspark.drafters.folder import EXPORT_MANIFEST
    from dspark.drafters.registry import build_drafter
    from dspark.presets.tiny import resolve_target
    from dspark.protocols import TrainableDrafter
    from dspark.targets import TargetAdapter

    target_name = resolve_target(args.target)
    target = TargetAdapter.from_pretrained(target_name)
    drafter = build_drafter(args.drafter, target)
    if not isinstance(drafter, TrainableDrafter):
        raise DsparkError(f"{args.drafter!r} has no weights to export; give a trained drafter or its folder")
    source = drafter_folder(args.drafter)
    out = export_drafter(
        drafter,
        target,
        args.out,
        fmt=args.fmt,
        dtype=DTYPES[args.dtype],
        source=source,
        target_name=target_name,
        force=args.force,
    )
    manifest = json.loads((out / EXPORT_MANIFEST).read_text())
    print(json.dumps({"out": str(out), "serve": str(out / SERVE_NAME), **manifest}, indent=2))
    return 0
