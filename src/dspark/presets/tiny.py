"""The embedded tiny target and built-in prompt sets shipped as package data (DESIGN §11)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from dspark.errors import DsparkError
from dspark.targets.smollm2 import SMOLLM2_NAME, ensure_smollm2

TINY_TARGET_NAME = "tiny"
PROMPT_DOMAINS = ("math", "code", "chat")
# The first 20 prompts of three public benchmarks, shipped so that `--bench gsm8k` works
# in a fresh clone (assets/benchmarks/NOTICE.md names their sources and licences).
SHIPPED_BENCHMARKS = ("gsm8k", "humaneval", "mt-bench")


def assets_dir() -> Path:
    return Path(str(resources.files("dspark") / "assets"))


def tiny_target_dir() -> Path:
    """Folder of the embedded tiny target (an ordinary HF model folder)."""
    path = assets_dir() / "tiny_target"
    if not (path / "config.json").is_file():
        raise DsparkError(
            f"the embedded tiny target is missing at {path}; rebuild it with `dspark build-tiny-target`"
        )
    return path


def resolve_target(name_or_path: str | None) -> str:
    """``None`` or ``"tiny"`` → the embedded target; ``"smollm2"`` → SmolLM2-135M-Instruct
    (fetched and converted on first use); anything else is a path or hub id."""
    if name_or_path in (None, "", TINY_TARGET_NAME):
        return str(tiny_target_dir())
    if name_or_path == SMOLLM2_NAME:
        return str(ensure_smollm2())
    return name_or_path


def builtin_prompts(domain: str) -> list[dict]:
    """Records ``{"turns": [...], "domain": ..., "reference": ...}`` of a built-in set."""
    if domain not in PROMPT_DOMAINS:
        raise DsparkError(f"unknown built-in prompt set {domain!r}; choose from {', '.join(PROMPT_DOMAINS)}")
    path = assets_dir() / "prompts" / f"{domain}.jsonl"
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def shipped_benchmark(name: str) -> Path:
    """The JSONL file of a shipped benchmark subset (:data:`SHIPPED_BENCHMARKS`)."""
    if name not in SHIPPED_BENCHMARKS:
        raise DsparkError(f"no shipped benchmark {name!r}; choose from {', '.join(SHIPPED_BENCHMARKS)}")
    return assets_dir() / "benchmarks" / f"{name}.jsonl"
