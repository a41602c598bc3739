"""``dspark bench startup|llamacpp|llamacpp-plot``: their arguments and ``--help`` texts; the run is
:mod:`dspark.commands.bench_tools`."""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.commands.argtypes import int_list, positive_int


def add_bench_startup_args(p: argparse.ArgumentParser) -> None:
    """Start-up seconds of `dspark --help` and of an argument error, beside the interpreter alone
    and `import torch, transformers`, each a fresh process, interleaved."""
    p.add_argument("--src", type=Path, default=None, help="other dspark sources to time")
    p.add_argument("--repeats", type=positive_int, default=5, help="runs of each command (the median counts)")


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def add_bench_llamacpp_args(p: argparse.ArgumentParser) -> None:
    """dspark's drafters inside llama.cpp's own binaries: τ and tokens/s over llama.cpp's plain
    decoding and prompt lookup, per target file, thread count and temperature (one process per
    prompt, methods interleaved); and what verifying k tokens costs in decode steps."""
    p.add_argument("--bin", type=Path, required=True, help="llama.cpp's bin folder (.ci/llamacpp_build.sh)")
    p.add_argument("--export", type=Path, required=True, help="a `dspark export --format gguf` folder")
    p.add_argument("--quants", type=_names, default="q4_1", help="target files: q4_1, q8_0, bf16, f32")
    p.add_argument("--threads", type=int_list, default="1", help="thread counts, comma-separated")
    p.add_argument("--temps", type=_floats, default="0", help="temperatures, comma-separated")
    p.add_argument("--p-mins", type=_floats, default="0,0.5", help="--spec-draft-p-min values")
    p.add_argument("--sets", type=_names, default="gsm8k,humaneval", help="held-out prompt sets")
    p.add_argument("--limit", type=positive_int, default=4, help="prompts per set")
    p.add_argument("--max-tokens", type=positive_int, default=96, help="tokens per answer")
    p.add_argument("--block-size", type=positive_int, default=7, help="most drafts per round (γ)")
    p.add_argument("--dspark-engine", action="store_true", help="also dspark's own engine (greedy runs)")
    p.add_argument(
        "--dspark-dtype", default="bfloat16", choices=["bfloat16", "float32"], help="dspark engine dtype"
    )
    p.add_argument("--json", type=Path, default=None, help="write every cell here")


def add_bench_llamacpp_plot_args(p: argparse.ArgumentParser) -> None:
    """The figure of `dspark bench llamacpp` runs: speed over llama.cpp's plain decoding per target
    file and method, and the cost of verifying k tokens against one decode step."""
    p.add_argument("runs", nargs="+", type=Path, help="JSON files of `dspark bench llamacpp --json`")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
