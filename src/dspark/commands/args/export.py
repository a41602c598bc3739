"""``dspark export``: its arguments and ``--help`` text; the run is :mod:`dspark.commands.export`."""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.commands.argtypes import drafter_spec
from dspark.commands.options import add_target
from dspark.drafters.registry import TRAINABLE

# Light copies, so that the parser needs no torch; a test pins them to formats.export's.
FORMATS = ("vllm", "sglang", "speculators", "hf", "gguf")  # formats.export.FORMATS
DTYPE_NAMES = ("bf16", "fp16", "fp32")  # the keys of formats.export.DTYPES


def add_export_args(p: argparse.ArgumentParser) -> None:
    """Export a drafter for vLLM, SGLang or HF, validated by re-loading it; SERVE.md has the commands."""
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
