"""The export's weight dtype: fp16 for llama.cpp's GGUF unless asked, bf16 for the other formats."""

from __future__ import annotations

import pytest

from dspark.cli import build_parser
from dspark.commands.export import export_dtype


@pytest.mark.parametrize(
    ("fmt", "asked", "written"),
    [("gguf", None, "fp16"), ("vllm", None, "bf16"), ("sglang", None, "bf16"), ("gguf", "bf16", "bf16")],
)
def test_the_default_follows_the_format(fmt, asked, written):
    assert export_dtype(fmt, asked) == written


def test_the_cli_leaves_the_dtype_to_the_format():
    args = build_parser().parse_args(["export", "--format", "gguf", "--drafter", "dspark", "--out", "x"])
    assert args.dtype is None and export_dtype(args.fmt, args.dtype) == "fp16"
