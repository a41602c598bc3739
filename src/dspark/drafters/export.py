"""Export a drafter as a folder that vLLM, SGLang or Hugging Face code loads (SPEC §5.4).

Formats:

- ``hf``: our own folder (:mod:`dspark.drafters.folder`) with the weights cast to the
  export dtype. For DSpark/DFlash this already is DeepSpec's layout.
- ``vllm`` / ``sglang``: the same, plus what those engines read:

  - DSpark/DFlash: a nested ``dflash_config`` ``{target_layer_ids, mask_token_id}``
    beside DeepSpec's top-level fields (vLLM's ``dflash`` method reads the nested one).
  - Eagle3: vLLM's ``LlamaForCausalLMEagle3`` layout. Its layer is a Llama decoder layer
    over ``[input_layernorm(embed) ; hidden_norm(h)]`` with residual ``h`` and a final
    ``norm``, exactly our :class:`~dspark.drafters.eagle3.Eagle3Layer`; its weights are
    named ``midlayer.*`` (SGLang's name; vLLM renames it to ``layers.0.*``). Its ``fc``
    reads exactly 3 target layers, and its aux layer id ``j`` is the *input* of target
    layer ``j``, i.e. the output of our layer ``j - 1``: vLLM id = our id + 1.

Every export also holds ``dspark_export.json`` (format, method, source, dtype, sha256 of
the weights, which our loader checks) and ``SERVE.md`` (the command lines of each engine).
The folder is written to a temporary folder, re-loaded there by the strict loader and
compared with the source drafter, and only then moved into place.
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from dspark import __version__
from dspark.drafters.folder import (
    CONFIG_NAME,
    EXPORT_MANIFEST,
    WEIGHTS_NAME,
    _finish,
    drafter_config_json,
    file_sha256,
    load_drafter,
)
from dspark.drafters.kinds import DrafterKind, kind_of_config
from dspark.errors import DsparkError
from dspark.targets import TargetAdapter

log = logging.getLogger(__name__)

FORMATS = ("vllm", "sglang", "hf")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SERVE_NAME = "SERVE.md"
ENGINE_EAGLE3_NUM_LAYERS = 3  # vLLM/SGLang build Eagle3's fc with input 3 * target_hidden_size
ENGINE_LAYER_NAME = "midlayer."  # the name SGLang's Eagle3 gives its layer (vLLM accepts it too)


class ExportError(DsparkError):
    """A drafter that cannot be written in the requested format, or an unsafe ``--out``."""


# -- layouts ------------------------------------------------------------------------------


def _engine_common(config: dict[str, Any]) -> None:
    """Fields every engine export needs whatever the transformers version reading it."""
    # The file holds its own lm_head.weight; a tied config would make a loader skip it.
    config["tie_word_embeddings"] = False
    # transformers 5 writes rope_parameters only; older readers (vLLM, SGLang) want rope_theta.
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]


def _deepspec_engine_layout(config, state, drafter):
    """DSpark/DFlash for vLLM/SGLang: DeepSpec's fields + the nested ``dflash_config``."""
    if config.get("mask_embedding"):
        raise ExportError(
            "this drafter learned its own mask embedding (its target's tokenizer has no mask token); "
            "DeepSpec's layout, vLLM and SGLang need a mask_token_id: retrain it with --mask-token TOKEN "
            "to serve it there, or export it with --format hf"
        )
    _engine_common(config)
    config["dflash_config"] = {
        "target_layer_ids": list(config["target_layer_ids"]),
        "mask_token_id": config["mask_token_id"],
    }
    return config, state


def _eagle3_engine_layout(config, state, drafter):
    """Eagle3 as vLLM's ``LlamaForCausalLMEagle3``: ``midlayer.*``, aux layer ids + 1."""
    ids = list(config["target_layer_ids"])
    if len(ids) != ENGINE_EAGLE3_NUM_LAYERS:
        raise ExportError(
            f"vLLM and SGLang's Eagle3 fuse exactly {ENGINE_EAGLE3_NUM_LAYERS} target layers (their fc "
            f"reads {ENGINE_EAGLE3_NUM_LAYERS} x hidden_size), but this drafter fuses {len(ids)} {ids}; "
            f"train an Eagle3 drafter with {ENGINE_EAGLE3_NUM_LAYERS} target_layer_ids (low, middle, high) "
            "to serve it there, or export it with --format hf"
        )
    if ids != sorted(ids):
        raise ExportError(
            f"target_layer_ids {ids} are not in ascending order; vLLM and SGLang concatenate the "
            "target's layers in ascending order, so fc would read them permuted"
        )
    dims = drafter.dims
    if dims.embed_scale != 1.0 or dims.logit_softcap is not None:
        raise ExportError(
            "vLLM and SGLang's Llama Eagle3 layer neither scales embeddings nor softcaps logits, "
            "which this target family does; export it with --format hf"
        )
    _engine_common(config)
    vllm_ids = [i + 1 for i in ids]  # vLLM: the input of layer j = the output of our layer j - 1
    config.update(
        model_type="llama",  # no q/k norm in the draft layer
        draft_vocab_size=config["vocab_size"],  # full vocabulary: no d2t table
        target_hidden_size=config["hidden_size"],
        eagle_aux_hidden_state_layer_ids=vllm_ids,
        eagle_config={"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": vllm_ids},
    )
    ours = "layers.0."
    state = {
        (ENGINE_LAYER_NAME + k.removeprefix(ours) if k.startswith(ours) else k): v for k, v in state.items()
    }
    return config, state


# Keyed by checkpoint architecture (DrafterKind.architecture), the format concept.
_ENGINE_LAYOUTS = {
    "Qwen3DSparkModel": _deepspec_engine_layout,
    "LlamaForCausalLMEagle3": _eagle3_engine_layout,
}


# -- SERVE.md -------------------------------------------------------------------------------


def serve_instructions(kind: DrafterKind, fmt: str, folder: Path, target_name: str, block_size: int) -> str:
    """``SERVE.md``: the command lines that serve ``folder`` with vLLM, SGLang and dspark."""
    folder_q, target_q = shlex.quote(str(folder)), shlex.quote(target_name)
    spec = json.dumps({"method": kind.name, "model": str(folder), "num_speculative_tokens": block_size})
    vllm = f"vllm serve {target_q} \\\n    --speculative-config {shlex.quote(spec)}"
    sglang = (
        f"python -m sglang.launch_server --model-path {target_q} \\\n"
        f"    --speculative-algorithm {kind.name.upper()} \\\n"
        f"    --speculative-draft-model-path {folder_q} \\\n"
        f"    --speculative-num-steps {block_size} --speculative-eagle-topk 1 "
        f"--speculative-num-draft-tokens {block_size + 1}"
    )
    ours = f"dspark serve --target {target_q} --drafter {folder_q} --block-size {block_size}"
    sections = [
        f"# Serving this {kind.name} drafter",
        f"Exported by dspark {__version__} as `{fmt}` for the target `{target_name}`; "
        f"block size γ = {block_size}.",
    ]
    if fmt == "hf":
        sections.append(
            "This folder is in our own layout; for vLLM or SGLang export it with `--format vllm` "
            "or `--format sglang` (they need other config fields, and Eagle3 other weight names)."
        )
    else:
        sections += [f"## vLLM\n\n```bash\n{vllm}\n```", f"## SGLang\n\n```bash\n{sglang}\n```"]
    sections += [
        f"## dspark\n\n```bash\n{ours}\n```",
        "## Caveats\n\n"
        "- The vLLM and SGLang commands were not run: those engines need a GPU, which the "
        "machine that wrote this export did not have. Check the flags against the "
        "documentation of your engine version.\n"
        "- DSpark and DFlash checkpoints are in DeepSpec's layout (architecture "
        "`Qwen3DSparkModel`); whether vLLM or SGLang serve them, and under which method "
        "name, depends on their version.\n"
        "- Eagle3 exports use vLLM's layer-id convention: `eagle_aux_hidden_state_layer_ids` "
        "= our `target_layer_ids` + 1 (vLLM captures the input of each listed layer).",
    ]
    return "\n\n".join(sections) + "\n"


# -- export ---------------------------------------------------------------------------------


def _check_out(out: Path, force: bool, source: Path | None) -> None:
    """Never lose data: refuse an existing non-empty ``out`` unless ``force``, and even then
    replace only a drafter folder that is not the source."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ExportError(f"--out {out} exists and is not a folder")
    if not any(out.iterdir()):
        return
    if not force:
        raise ExportError(f"--out {out} exists and is not empty; pass --force to replace it")
    if not (out / CONFIG_NAME).is_file():
        raise ExportError(f"--out {out} is not a drafter folder; refusing to replace it even with --force")
    if source is not None and source.resolve().is_relative_to(out.resolve()):  # out itself or a parent
        raise ExportError(f"--out {out} holds the source drafter {source}; export to another folder")


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
        # The file's rounding, in the dtype the loader builds the drafter in.
        expected = value.detach().to(dtype).to(theirs[key].dtype)
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
) -> Path:
    """Write ``drafter`` (trained for ``target``) to ``out`` in format ``fmt``; return ``out``.

    ``source`` (the drafter folder) and ``target_name`` (what engines pass as the model)
    are recorded in the manifest and ``SERVE.md``. The export is validated (module
    docstring) before it replaces anything.
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose from {', '.join(FORMATS)}")
    kind = kind_of_config(drafter.config)
    out = Path(out).expanduser()
    source_path = Path(source) if source is not None and Path(source).is_dir() else None
    _check_out(out, force, source_path)

    config = drafter_config_json(drafter, target)
    dtype_name = str(dtype).removeprefix("torch.")
    config["torch_dtype"] = config["dtype"] = dtype_name
    state = {k: v.detach().to(dtype).contiguous().cpu() for k, v in drafter.state_dict().items()}
    if fmt != "hf":
        config, state = _ENGINE_LAYOUTS[kind.architecture](config, state, drafter)

    target_name = target_name or str(target.config.name_or_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        manifest = {
            "format": fmt,
            "method": kind.name,
            "architecture": config["architectures"][0],
            "source": str(source) if source is not None else None,
            "target": target_name,
            "dtype": dtype_name,
            "block_size": config["block_size"],
            "sha256": {WEIGHTS_NAME: file_sha256(tmp / WEIGHTS_NAME)},
            "dspark_version": __version__,
        }
        (tmp / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        (tmp / SERVE_NAME).write_text(
            serve_instructions(kind, fmt, out.resolve(), target_name, config["block_size"])
        )
        _validate(tmp, drafter, target, kind, dtype)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("exported %s drafter for %s to %s", kind.name, fmt, out)
    return _finish(tmp, out)
