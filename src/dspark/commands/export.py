"""``dspark export``: write a drafter folder that vLLM, SGLang or HF code loads (DESIGN §5.4)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dspark.commands.argtypes import drafter_spec
from dspark.commands.loading import drafter_folder
from dspark.commands.options import add_target
from dspark.drafters.registry import TRAINABLE
from dspark.errors import DsparkError

# Light copies, so that the parser needs no torch; a test pins them to formats.export's.
FORMATS = ("vllm", "sglang", "speculators", "hf", "gguf")  # formats.export.FORMATS
DTYPE_NAMES = ("bf16", "fp16", "fp32")  # the keys of formats.export.DTYPES


def add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        required=True,
        choices=FORMATS,
        dest="fmt",
        help="vllm: for `vllm serve TARGET --speculative-config` (method dspark or eagle3); "
        "speculators: for `vllm serve FOLDER`; sglang: for --speculative-algorithm DSPARK/EAGLE3 "
        "(with its STS JSON); hf: our own folder, DeepSpec's layout for DSpark/DFlash; gguf: the draft "
        "GGUF llama.cpp serves (llama-server -md, --spec-type draft-dspark), with the target's GGUF "
        "where it has none. "
        "What an engine cannot represent is refused with the reason",
    )
    p.add_argument(
        "--drafter",
        required=True,
        type=drafter_spec,
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
        "--dtype",
        choices=sorted(DTYPE_NAMES),
        default=None,
        help="weight dtype (default: fp16 for --format gguf, whose bf16 kernels run a draft 2-3x slower "
        "on CPUs; bf16 otherwise)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing drafter folder at --out")
    p.add_argument(
        "--sps-table",
        type=Path,
        default=None,
        metavar="JSON",
        help="--format sglang only: an SPS(B) table measured on the serving machine (ours from "
        "`dspark profile`, or SGLang's), written as sglang_sps_table.json for its DSpark scheduler",
    )


def export_dtype(fmt: str, dtype: str | None) -> str:
    """The weight dtype of an export: the one asked for, else fp16 for llama.cpp's GGUF (its
    bf16 kernels ran a draft 2-3x slower than fp16 on CPUs, BENCHMARKS) and bf16 for the rest."""
    return dtype or ("fp16" if fmt == "gguf" else "bf16")


def main_export(args: argparse.Namespace) -> int:
    """Export a drafter for vLLM, SGLang or HF, validated by re-loading it; SERVE.md has the commands."""
    from dspark.formats.build import build_drafter
    from dspark.formats.export import DTYPES, SERVE_NAME, export_drafter, read_sps_table
    from dspark.formats.folder import EXPORT_MANIFEST
    from dspark.presets.tiny import resolve_target
    from dspark.protocols import TrainableDrafter
    from dspark.targets import TargetAdapter

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
