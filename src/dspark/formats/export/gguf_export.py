"""Write a ``--format gguf`` export: ``draft.gguf``, the target's GGUF where it has none, ``SERVE.md``.

The draft's tokenizer must be the target GGUF's (llama.cpp compares the two vocabularies
token by token), so the target's GGUF is found first: SmolLM2's pinned Q4_1 file
(:func:`~dspark.targets.smollm2.smollm2_gguf`) for ``--target smollm2``; for any other
target dspark writes one (:mod:`~dspark.formats.export.gguf_target`, Qwen3 targets with
a byte-level BPE tokenizer such as the embedded tiny one) as ``target.gguf`` beside the
draft, or refuses with the reason. The files are read back and compared with what was
meant to be written before the folder replaces ``--out``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import torch

from dspark import __version__
from dspark.formats.export.gguf_draft import DraftGguf, draft_content
from dspark.formats.export.gguf_file import GgufContent, read_gguf, write_gguf
from dspark.formats.export.gguf_target import target_content
from dspark.formats.export.layouts import ExportError
from dspark.formats.folder import EXPORT_MANIFEST, drafter_config_json, file_sha256
from dspark.targets.smollm2 import GGUF_SHA256, smollm2_gguf

DRAFT_NAME = "draft.gguf"
TARGET_NAME = "target.gguf"
GGUF_FILES = (DRAFT_NAME, TARGET_NAME)
SMOLLM2_MARKER = "dspark-target.json"


def target_gguf(folder: Path) -> tuple[Path | None, GgufContent | None]:
    """The target's own GGUF (a path) or the content dspark writes for it (exactly one is set)."""
    marker = folder / SMOLLM2_MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("gguf_sha256") == GGUF_SHA256:
        return smollm2_gguf(), None
    if not (folder / "config.json").is_file():
        raise ExportError(f"--format gguf needs the target as a local folder, not {str(folder)!r}")
    return None, target_content(folder)


def _check_written(path: Path, content: GgufContent) -> None:
    """Read ``path`` back: every tensor bit-identical, every metadata value as meant."""
    back = read_gguf(path)
    if set(back.tensors) != set(content.tensors):
        raise ExportError(f"export validation failed: {path.name} holds other tensors than written")
    for name, t in content.tensors.items():
        if not torch.equal(back.tensors[name], t.contiguous()):
            raise ExportError(f"export validation failed: {name} differs after re-reading {path.name}")
    for key, (value, kind, _) in content.metadata.items():
        if kind == "FLOAT32":
            value = float(np.float32(value))  # what a 4-byte float holds
        if key != "general.architecture" and back.metadata.get(key) != value:
            raise ExportError(f"export validation failed: {key} differs after re-reading {path.name}")


def serve_text(
    draft: DraftGguf,
    folder: Path,
    target: Path,
    block_size: int,
    method: str,
    target_name: str,
    dtype_name: str,
) -> str:
    """``SERVE.md``: llama-server, llama-cli and llama-speculative-simple command lines."""
    t, d = shlex.quote(str(target)), shlex.quote(str(folder / DRAFT_NAME))
    conf = "conf_proj.weight" in draft.content.tensors
    flags = f"--spec-type {draft.spec_type} --spec-draft-n-max {block_size} --spec-draft-p-min 0"
    lines = [
        f"# Serving this {method} drafter with llama.cpp",
        f"Exported by dspark {__version__} as `gguf` for the target `{target_name}`; "
        f"block size γ = {block_size}.",
        "Built from the llama.cpp sources vendored in `llama-cpp-python==0.3.36` "
        "(`bash .ci/llamacpp_build.sh` builds them); the draft shares the target's embedding and LM head, "
        "so it is always loaded beside this target.",
        "## llama-server (OpenAI API on port 8080)\n\n"
        f"```bash\nllama-server -m {t} -md {d} \\\n    {flags}\n```",
        f"## llama-cli\n\n```bash\nllama-cli -m {t} -md {d} \\\n    {flags}\n```",
        "## Acceptance statistics\n\n`llama-speculative-simple` prints drafted and accepted counts "
        "(τ = 1 + accepted / rounds):\n\n"
        f"```bash\nllama-speculative-simple -m {t} -md {d} \\\n    {flags} --temp 0 -n 128 -p 'PROMPT'\n```",
    ]
    if conf:
        lines.append(
            "`--spec-draft-p-min P` truncates each draft at the first slot whose confidence head "
            "predicts acceptance below P (0 drafts all γ); it pays where verifying a long block costs "
            "much more than a decode step (see BENCHMARKS, llama.cpp)."
        )
    lines.extend(draft.notes)
    if dtype_name == "bf16":
        lines.append(
            "On a CPU, export with `--dtype fp16`: llama.cpp ran this BF16 draft 2-3x slower than the "
            "same draft in F16 or F32 (SmolLM2's, one thread, a CPU with AVX512-BF16; BENCHMARKS)."
        )
    return "\n\n".join(lines) + "\n"


def export_gguf(
    drafter, target, tmp: Path, out: Path, *, dtype: torch.dtype, source, target_name: str
) -> dict:
    """Write the GGUF export of ``drafter`` into ``tmp`` (published at ``out``); return its manifest."""
    dtype_name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    config = drafter_config_json(drafter, target)
    folder = Path(str(target.config.name_or_path))
    own, written = target_gguf(folder)
    tokenizer = written if written is not None else read_gguf(own, with_tensors=False)
    draft = draft_content(
        drafter.state_dict(),
        config,
        drafter.dims,
        tokenizer_source=tokenizer,
        context_length=int(target.max_context),
        dtype_name=dtype_name,
        name=f"dspark {config['dspark_method']} drafter for {folder.name}",
    )
    files = {DRAFT_NAME: draft.content}
    if written is not None:
        files[TARGET_NAME] = written
    for name, content in files.items():
        write_gguf(tmp / name, content)
        _check_written(tmp / name, content)
    target_path = out.resolve() / TARGET_NAME if written is not None else own
    manifest = {
        "format": "gguf",
        "method": config["dspark_method"],
        "architecture": "dflash",
        "source": str(source) if source is not None else None,
        "target": target_name,
        "target_gguf": str(target_path),
        "dtype": dtype_name,
        "block_size": config["block_size"],
        "spec_type": draft.spec_type,
        "sha256": {name: file_sha256(tmp / name) for name in files},
        "dspark_version": __version__,
    }
    (tmp / "SERVE.md").write_text(
        serve_text(
            draft,
            out.resolve(),
            target_path,
            config["block_size"],
            config["dspark_method"],
            target_name,
            dtype_name,
        )
    )
    (tmp / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
