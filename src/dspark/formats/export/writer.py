"""``export_drafter``: write, validate and only then move an export into place (DESIGN §5.4).

The folder is written to a temporary folder beside ``--out``: the format's layout
(:mod:`~dspark.formats.export.layouts`), ``dspark_export.json`` (format, method, source,
dtype, sha256 of every file the engines read, which our loader checks) and ``SERVE.md``.
It is re-loaded there by the strict loader and compared with the source drafter, and
only then replaces ``--out``; an existing folder is never lost (:func:`_out_check`).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from dspark import __version__
from dspark.drafters.draft_vocab import to_file_state
from dspark.drafters.kinds import DrafterKind, kind_of_config
from dspark.formats.export.gguf_export import GGUF_FILES, export_gguf
from dspark.formats.export.layouts import FORMATS, LAYOUTS, ExportError, ExportInput
from dspark.formats.export.serve import serve_instructions
from dspark.formats.export.sidecars import SPS_NAME, STS_NAME
from dspark.formats.folder import (
    CONFIG_NAME,
    DRAFTER_FILES,
    EXPORT_MANIFEST,
    WEIGHTS_NAME,
    _finish,
    drafter_config_json,
    file_sha256,
    load_drafter,
)
from dspark.output_folders import OutputFolderError, check_replaceable, temp_folder
from dspark.targets import TargetAdapter

log = logging.getLogger(__name__)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SERVE_NAME = "SERVE.md"


# -- export ---------------------------------------------------------------------------------


def _out_check(force: bool, source: Path | None, out: Path) -> dict:
    """Never lose data (:mod:`dspark.output_folders`): an existing non-empty ``out`` is replaced
    only with ``force``, only when it holds nothing but a drafter folder's or an export's files,
    and never when it holds the source. An export belongs to the path it was written at."""
    return {
        "command": "export",
        "run": str(out.resolve()),
        "flag": "--out",
        "inputs": [source],
        "force": force,
        "own_needs_force": True,
        "names": (*DRAFTER_FILES, STS_NAME, SPS_NAME, *GGUF_FILES),
    }


def _validate(folder: Path, drafter: nn.Module, target: TargetAdapter, kind: DrafterKind, dtype) -> None:
    """Re-load ``folder`` with the strict loader: config and weights must be the source's in ``dtype``."""
    loaded = load_drafter(folder, target)
    n = target.num_layers
    if kind.config_fields(loaded.config, num_target_layers=n) != kind.config_fields(
        drafter.config, num_target_layers=n
    ):
        raise ExportError(f"export validation failed: {folder} re-loads with another config")
    theirs = loaded.state_dict()
    for key, value in drafter.state_dict().items():
        # The file's rounding, in the dtype the loader builds the drafter in (ids stay integers).
        expected = (value.detach().to(dtype) if value.is_floating_point() else value).to(theirs[key].dtype)
        if not torch.equal(theirs[key], expected.to(theirs[key].device)):
            raise ExportError(f"export validation failed: {key} differs after re-loading {folder}")


def export_drafter(
    drafter: nn.Module,
    target: TargetAdapter,
    out: str | Path,
    *,
    fmt: str,
    dtype: torch.dtype = torch.bfloat16,
    source: str | Path | None = None,
    target_name: str | None = None,
    force: bool = False,
    sps_table: dict | None = None,
) -> Path:
    """Write ``drafter`` (trained for ``target``) to ``out`` in format ``fmt``; return ``out``.

    ``source`` (the drafter folder) and ``target_name`` (what engines pass as the model)
    are recorded in the manifest and ``SERVE.md``; ``sps_table`` (from
    :func:`~dspark.formats.export.sidecars.read_sps_table`) is converted for SGLang.
    The export is validated (module docstring) before it replaces anything.
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose from {', '.join(FORMATS)}")
    if sps_table is not None and fmt != "sglang":
        raise ExportError(f"--sps-table is read by SGLang only; it has no place in --format {fmt}")
    kind = kind_of_config(drafter.config)
    out = Path(out).expanduser()
    source_path = Path(source) if source is not None and Path(source).is_dir() else None
    try:
        check_replaceable(out, **_out_check(force, source_path, out))
    except OutputFolderError as e:
        raise ExportError(str(e)) from None
    if fmt == "gguf":  # llama.cpp's single-file format, not a safetensors folder
        check = _out_check(force, source_path, out)
        return _export_gguf(drafter, target, out, dtype, source, target_name, check)

    config = drafter_config_json(drafter, target)
    dtype_name = str(dtype).removeprefix("torch.")
    config["torch_dtype"] = config["dtype"] = dtype_name
    # Every tensor the engines read, the target's embedding / LM head included (a drafter
    # folder may leave them out: the loaded drafter has them back); draft_ids as d2t / t2d.
    state = to_file_state(drafter.state_dict(), target.vocab_size)
    state = {
        k: (v.detach().to(dtype) if v.is_floating_point() else v).contiguous().cpu() for k, v in state.items()
    }
    target_name = target_name or str(target.config.name_or_path)
    layout = LAYOUTS[fmt](
        ExportInput(
            kind=kind,
            drafter=drafter,
            config=config,
            state=state,
            target_name=target_name,
            target_architectures=tuple(getattr(target.config, "architectures", None) or ()),
            sps_table=sps_table,
        )
    )
    config = layout.config

    tmp = temp_folder(out)
    try:
        save_file(layout.state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for name, text in layout.files.items():
            (tmp / name).write_text(text)
        manifest = {
            "format": fmt,
            "method": kind.name,
            "architecture": config["architectures"][0],
            "source": str(source) if source is not None else None,
            "target": target_name,
            "dtype": dtype_name,
            "block_size": config["block_size"],
            "sha256": {name: file_sha256(tmp / name) for name in (WEIGHTS_NAME, *layout.files)},
            "dspark_version": __version__,
        }
        (tmp / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        (tmp / SERVE_NAME).write_text(
            serve_instructions(kind, fmt, out.resolve(), target_name, config, set(layout.files), layout.notes)
        )
        _validate(tmp, drafter, target, kind, dtype)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("exported %s drafter for %s to %s", kind.name, fmt, out)
    return _finish(tmp, out, **_out_check(force, source_path, out))


def _export_gguf(drafter, target, out: Path, dtype, source, target_name: str | None, check: dict) -> Path:
    """``--format gguf`` (:mod:`~dspark.formats.export.gguf_export`), validated and published alike."""
    tmp = temp_folder(out)
    try:
        export_gguf(
            drafter, target, tmp, out, dtype=dtype, source=source,
            target_name=target_name or str(target.config.name_or_path),
        )  # fmt: skip
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("exported %s drafter for llama.cpp to %s", kind_of_config(drafter.config).name, out)
    return _finish(tmp, out, **check)
