"""``SERVE.md``: the command lines that serve an export, with each engine's current flags.

Flags are those of vLLM 0.32 (``--speculative-config`` JSON keys ``method``, ``model``,
``num_speculative_tokens``, ``enable_adaptive_verification``; ``vllm serve <folder>``
for the speculators format) and SGLang 0.5.23 (``--speculative-algorithm DSPARK|EAGLE3``,
``--speculative-dspark-block-size``, ``--speculative-dspark-confidence-sts-path``,
``--speculative-dspark-sps-table-path``).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from dspark import __version__
from dspark.drafters.kinds import DrafterKind
from dspark.formats.export.sidecars import SPS_NAME, STS_NAME


def _vllm(kind: DrafterKind, folder: Path, target: str, gamma: int, adaptive: bool) -> str:
    method = "dspark" if kind.uses_mask_token else "eagle3"  # DFlash of this layout: dspark
    spec = {"method": method, "model": str(folder), "num_speculative_tokens": gamma}
    if adaptive:
        spec["enable_adaptive_verification"] = True
    return f"vllm serve {shlex.quote(target)} \\\n    --speculative-config {shlex.quote(json.dumps(spec))}"


def _sglang(kind: DrafterKind, folder: Path, target: str, gamma: int, files: set[str], static: bool) -> str:
    head = f"python -m sglang.launch_server --model-path {shlex.quote(target)} \\\n"
    draft = f"    --speculative-draft-model-path {shlex.quote(str(folder))}"
    if not kind.uses_mask_token:
        return (
            head + "    --speculative-algorithm EAGLE3 \\\n" + draft + " \\\n"
            f"    --speculative-num-steps {gamma} --speculative-eagle-topk 1 "
            f"--speculative-num-draft-tokens {gamma + 1}"
        )
    lines = [draft, f"    --speculative-dspark-block-size {gamma}"]
    for name, flag in ((STS_NAME, "confidence-sts-path"), (SPS_NAME, "sps-table-path")):
        if name in files:
            lines.append(f"    --speculative-dspark-{flag} {shlex.quote(str(folder / name))}")
    env = "SGLANG_RAGGED_VERIFY_MODE=static " if static else ""
    return env + head + "    --speculative-algorithm DSPARK \\\n" + " \\\n".join(lines)


def serve_instructions(
    kind: DrafterKind,
    fmt: str,
    folder: Path,
    target_name: str,
    config: dict,
    files: set[str],
    notes: tuple[str, ...],
) -> str:
    """The text of ``SERVE.md`` for an export of ``kind`` in format ``fmt`` at ``folder``."""
    gamma = config["block_size"]
    target_q, folder_q = shlex.quote(target_name), shlex.quote(str(folder))
    sections = [
        f"# Serving this {kind.name} drafter",
        f"Exported by dspark {__version__} as `{fmt}` for the target `{target_name}`; "
        f"block size γ = {gamma}.",
    ]
    confident = bool(config.get("enable_confidence_head"))
    if fmt == "vllm":
        sections.append(f"## vLLM\n\n```bash\n{_vllm(kind, folder, target_name, gamma, confident)}\n```")
        if kind.name == "dflash":
            sections.append("vLLM serves DeepSpec-layout DFlash drafters with its `dspark` method.")
        if confident:
            sections.append(
                "`enable_adaptive_verification` sizes each request's verification from the "
                "confidence head; drop it to verify every draft."
            )
    elif fmt == "speculators":
        sections.append(
            f"## vLLM\n\nThe folder names its target (`speculators_config.verifier`):\n\n"
            f"```bash\nvllm serve {folder_q}\n```"
        )
    elif fmt == "sglang":
        static = kind.uses_mask_token and not confident
        sections.append(
            f"## SGLang\n\n```bash\n{_sglang(kind, folder, target_name, gamma, files, static)}\n```"
        )
    else:
        sections.append(
            "This folder is our own layout (for DSpark/DFlash DeepSpec's `Qwen3DSparkModel`); "
            "for vLLM or SGLang export it with `--format vllm`, `--format speculators` or "
            "`--format sglang`."
        )
    ours = f"dspark serve --target {target_q} --drafter {folder_q} --block-size {gamma}"
    sections.append(f"## dspark\n\n```bash\n{ours}\n```")
    caveats = [
        "vLLM's loader and modules were checked on CPU against this layout (tests/interop); "
        "serving needs vLLM's GPU runner and was not run. SGLang was not run (GPU only); its "
        "expectations were read from SGLang 0.5.23's source.",
        *notes,
    ]
    sections.append("## Caveats\n\n" + "\n".join(f"- {c}" for c in caveats))
    return "\n\n".join(sections) + "\n"
