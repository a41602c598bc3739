"""Drafters as Hugging Face model folders in DeepSpec's layout (DESIGN §5.4).

``config.json`` = the target's config + the drafter fields DeepSpec, vLLM and SGLang
read (``block_size``, ``num_target_layers``, ``target_layer_ids``, ``mask_token_id``,
``markov_rank``, ``markov_head_type``, ``enable_confidence_head``,
``confidence_head_with_markov``, ``num_hidden_layers`` = draft layers,
``architectures``) + ours (``dspark_method``, ``sts_temperatures``);
``model.safetensors`` = ``drafter.state_dict()`` with no prefix.

The loader also reads the folders ``dspark export`` writes: vLLM/SGLang name Eagle3's
single layer ``midlayer`` (read as ``layers.0``), the ``speculators`` format nests the
layer config under ``transformer_layer_config``, and ``dspark_export.json`` holds the
sha256 of the weights, checked before they are read. RNN-head checkpoints of older
versions (``markov_head.rnn_proj.weight``) load with a zero ``joint_proj.bias``.

Loading validates every field against the target and fails loudly on a missing or
unexpected key or a shape mismatch — never a silent skip or zero-fill: silent
block-size and LM-head mismatches are the most reported cause of collapsed acceptance.
Sizes are checked against the safetensors header before anything is built, and
weights must be finite (:mod:`dspark.formats.folder_checks`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dspark.drafters.common import build_from_target, drafter_dims, resolve_target_fields, set_draft_ids
from dspark.drafters.draft_vocab import from_file_state, set_full_head, to_file_state
from dspark.drafters.kinds import DrafterKind, kind_of_config, kind_of_folder_config
from dspark.errors import DsparkError
from dspark.formats.folder_checks import (
    SIZE_FIELDS,
    check_config_fields,
    check_finite,
    check_weight_shapes,
    header_shapes,
)
from dspark.formats.shared_weights import RECORD_FIELD, SHARED_KEYS, check_record, strip_shared, target_copy
from dspark.heads.rnn import upgrade_rnn_keys
from dspark.output_folders import check_replaceable, publish_folder, temp_folder
from dspark.targets import TargetAdapter, validate_layer_ids

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
EXPORT_MANIFEST = "dspark_export.json"  # written by `dspark export`: format, source, checksums
# vLLM/SGLang's Eagle3 checkpoints name their one decoder layer `midlayer` (vLLM reads it as layers.0).
_SINGLE_LAYER_ALIAS = ("midlayer.", "layers.0.")
# Drafter config fields written at the top level of config.json (target fields stay beside them).
_TARGET_FIELDS_CHECKED = ("vocab_size", "hidden_size")


class DrafterLoadError(DsparkError):
    """A drafter folder that does not fit the target, or is incomplete or corrupt."""


def drafter_config_json(drafter: nn.Module, target: TargetAdapter) -> dict[str, Any]:
    """The full ``config.json`` of ``drafter`` for ``target`` (DESIGN §5.4)."""
    kind = kind_of_config(drafter.config)
    out = target.config.to_dict()
    out.pop("architectures", None)
    out.update(kind.config_fields(drafter.config, num_target_layers=target.num_layers))
    # One attention type per *draft* layer (all full attention), not the target's list:
    # transformers 5 refuses a config whose layer_types and num_hidden_layers disagree.
    out["layer_types"] = ["full_attention"] * out["num_hidden_layers"]
    out["architectures"] = [kind.architecture]
    out["dspark_method"] = kind.name
    out["torch_dtype"] = str(next(drafter.parameters()).dtype).removeprefix("torch.")
    return out


def file_contents(
    state: dict[str, torch.Tensor],
    config: dict[str, Any],
    target: TargetAdapter,
    *,
    keep_shared: bool = False,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The weights and config.json a drafter folder holds for a drafter ``state`` dict.

    The copies of the target's embedding / LM head are left out and recorded unless
    ``keep_shared`` (:mod:`dspark.formats.shared_weights`); a reduced draft vocabulary is
    written as vLLM's ``d2t`` / ``t2d`` (:func:`~dspark.drafters.draft_vocab.to_file_state`).
    """
    config = dict(config)
    config.pop(RECORD_FIELD, None)
    if not keep_shared:
        state, record = strip_shared(state, target)
        if record is not None:
            config[RECORD_FIELD] = record
    return to_file_state(state, target.vocab_size), config


def cast_floating(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """``state`` with its floating-point tensors cast to ``dtype`` (None: unchanged); integer and
    bool tables (a reduced vocabulary's ``d2t`` / ``t2d``) keep their dtype: ids above 256 are
    not exact in bf16."""
    return {
        k: v.detach().to(dtype) if dtype is not None and v.is_floating_point() else v.detach()
        for k, v in state.items()
    }


def save_drafter(
    folder: str | Path,
    drafter: nn.Module,
    target: TargetAdapter,
    *,
    dtype=None,
    keep_shared: bool = False,
    force: bool = False,
) -> Path:
    """Write ``drafter`` as an HF folder, atomically (temp folder, then rename); see :func:`file_contents`.

    An existing folder is replaced only when an earlier save wrote it, or with ``force``
    (:func:`_finish`)."""
    folder = Path(folder)
    state, config = file_contents(
        drafter.state_dict(), drafter_config_json(drafter, target), target, keep_shared=keep_shared
    )
    state = {k: v.contiguous().cpu() for k, v in cast_floating(state, dtype).items()}
    if dtype is not None:
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
    tmp = temp_folder(folder)
    save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
    (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return _finish(tmp, folder, force=force)


# The files of a drafter folder: an unmarked folder holding only these is replaced with --force.
DRAFTER_FILES = (CONFIG_NAME, WEIGHTS_NAME, EXPORT_MANIFEST, "SERVE.md")


def _finish(tmp: Path, folder: Path, *, command: str = "save", **check) -> Path:
    """Move the finished temporary folder in place; an existing ``folder`` is replaced only
    when its marker says ``command`` wrote it for the same run, or with ``force`` when it holds
    nothing but a drafter folder's files (:mod:`dspark.output_folders`)."""
    check.setdefault("names", DRAFTER_FILES)
    return publish_folder(tmp, folder, command=command, **check)


def drafter_folder_check(folder: str | Path, checkpoint: Path | None = None, **check) -> Path:
    """Refuse to publish training's drafter folder where it would replace what this run did not
    write (:func:`_finish`); ``check``: ``run``, ``force``. Call it before training, too."""
    return check_replaceable(Path(folder), command="train", inputs=[checkpoint], names=DRAFTER_FILES, **check)


def publish_checkpoint(
    checkpoint: str | Path, folder: str | Path, target: TargetAdapter | None = None, **check
) -> Path:
    """A training checkpoint's ``config.json`` + ``model.safetensors`` as a drafter folder.

    With ``target``, written through :func:`file_contents` (the target's tensors left out,
    ``d2t``); without, the two files copied as they are (a checkpoint of a full-vocabulary
    drafter holds every key a folder needs). ``check``: the training ``run`` and ``force``
    (:func:`drafter_folder_check`).
    """
    checkpoint, folder = Path(checkpoint), Path(folder)
    drafter_folder_check(folder, checkpoint, **check)  # before copying gigabytes
    tmp = temp_folder(folder)
    if target is None:
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            shutil.copyfile(checkpoint / name, tmp / name)
    else:
        raw = json.loads((checkpoint / CONFIG_NAME).read_text())
        state, config = file_contents(load_file(str(checkpoint / WEIGHTS_NAME)), raw, target)
        save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return _finish(tmp, folder, command="train", inputs=[checkpoint], **check)


def read_config(folder: Path) -> dict[str, Any]:
    """The JSON object in ``folder/config.json`` (the speculators layout flattened); a
    :class:`DrafterLoadError` for a missing file, bad JSON or a non-object."""
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise DrafterLoadError(f"{folder} is not a drafter folder (no {CONFIG_NAME})")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DrafterLoadError(f"{path}: not valid JSON ({e.msg})") from None
    except UnicodeDecodeError:
        raise DrafterLoadError(f"{path}: not UTF-8 text") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.int_info)
        raise DrafterLoadError(f"{path}: not a drafter config ({str(e).split(';')[0]})") from None
    if not isinstance(raw, dict):
        raise DrafterLoadError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    layer = raw.get("transformer_layer_config")
    if isinstance(layer, dict):  # the speculators layout: the layer config is nested
        raw = {**layer, **{k: v for k, v in raw.items() if k != "transformer_layer_config"}}
    return raw


def _check_against_target(raw: dict[str, Any], kind: DrafterKind, target: TargetAdapter, where: Path) -> None:
    problems = []
    for name in _TARGET_FIELDS_CHECKED:
        target_value = target.vocab_size if name == "vocab_size" else target.hidden_size
        if raw.get(name) != target_value:
            problems.append(f"{name} {raw.get(name)} != the target's {target_value}")
    if "num_target_layers" in raw and raw["num_target_layers"] != target.num_layers:
        problems.append(f"num_target_layers {raw['num_target_layers']} != the target's {target.num_layers}")
    ids = raw.get("target_layer_ids")
    try:
        validate_layer_ids(ids, target.num_layers)
    except (ValueError, TypeError) as e:
        problems.append(f"target_layer_ids {ids}: {e}")
    if kind.uses_mask_token and not raw.get("mask_embedding"):
        mask = raw.get("mask_token_id")
        if not isinstance(mask, int) or not 0 <= mask < target.vocab_size:
            problems.append(
                f"mask_token_id {mask} is not in the target's vocabulary (0..{target.vocab_size - 1})"
            )
    n = raw.get("draft_vocab_size")
    if isinstance(n, int) and n > target.vocab_size:
        problems.append(f"draft_vocab_size {n} > the target's vocabulary {target.vocab_size}")
    block = raw.get("block_size")
    if not isinstance(block, int) or block < 1:
        problems.append(f"block_size {block} must be a positive integer")
    if problems:
        raise DrafterLoadError(f"{where}: drafter does not fit this target: " + "; ".join(problems))


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 16 MiB chunks (drafter weights reach gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _verify_checksums(folder: Path) -> None:
    """Refuse an exported folder whose files no longer match the sha256 its manifest recorded."""
    path = folder / EXPORT_MANIFEST
    if not path.is_file():
        return
    try:
        sums = json.loads(path.read_text())["sha256"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise DrafterLoadError(f"{path}: unreadable export manifest ({str(e).split(';')[0]})") from None
    # The manifest vouches for the weights, or for nothing: a sha256 table without them (edited
    # by hand) would let flipped bytes load unverified.
    if not isinstance(sums, dict) or WEIGHTS_NAME not in sums:
        raise DrafterLoadError(f"{path}: the export manifest records no sha256 of {WEIGHTS_NAME}")
    for name, expected in sums.items():
        file = folder / name
        if not file.is_file():
            raise DrafterLoadError(f"{folder}: export is incomplete: {name} is missing")
        if file_sha256(file) != expected:
            raise DrafterLoadError(
                f"{file}: export is corrupted: checksum mismatch with {EXPORT_MANIFEST} "
                "(re-run `dspark export`)"
            )


def _unalias_keys(state: dict[str, torch.Tensor], where: Path) -> dict[str, torch.Tensor]:
    """``midlayer.*`` → ``layers.0.*``; a folder holding both names is ambiguous."""
    alias, name = _SINGLE_LAYER_ALIAS
    if not any(k.startswith(alias) for k in state):
        return state
    if any(k.startswith(name) for k in state):
        raise DrafterLoadError(f"{where}: weights hold both {alias}* and {name}* keys; keep one of the two")
    return {(name + k.removeprefix(alias) if k.startswith(alias) else k): v for k, v in state.items()}


def _check_state(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], where: Path) -> None:
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise DrafterLoadError(
            f"{where}: weights do not match the config: missing keys {missing or 'none'}, "
            f"unexpected keys {unexpected or 'none'}"
        )
    wrong = [
        f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}"
        for k, v in expected.items()
        if state[k].shape != v.shape
    ]
    if wrong:
        raise DrafterLoadError(f"{where}: weight shapes do not match the config: " + "; ".join(wrong))


def _check_shared_weights(state: dict[str, torch.Tensor], target: TargetAdapter, where: Path) -> None:
    """Refuse a drafter whose copies of the embedding / LM head are not this target's.

    The fields and shapes of a drafter trained for another target of the same shape
    pass every other check; its frozen copies differ far beyond bf16 rounding. 256
    spread rows are compared: enough to tell, and cheap for a 150k-token vocabulary.
    """
    ids = state.get("draft_ids")  # a reduced draft vocabulary: the head holds the target's rows of ids
    for key in SHARED_KEYS:
        theirs = target_copy(target, key, ids)
        if key not in state or state[key].shape != theirs.shape:
            continue
        rows = torch.linspace(0, state[key].shape[0] - 1, 256).long().unique()  # [<=256]
        a = state[key][rows].float()  # [n, H]
        b = theirs[rows.to(theirs.device)].float().cpu()  # [n, H]
        if not torch.allclose(a, b, rtol=2e-2, atol=1e-3 * float(b.abs().max().clamp_min(1e-6))):
            raise DrafterLoadError(
                f"{where}: drafter was trained for another target: its {key} differs from this target's "
                f"(max difference {float((a - b).abs().max()):.3g})"
            )


def _upgraded_shapes(shapes: dict[str, tuple[int, ...]], where: Path) -> dict[str, tuple[int, ...]]:
    """Header shapes as the legacy-key upgrade will name them (meta tensors: nothing allocated)."""
    try:
        meta = upgrade_rnn_keys({k: torch.empty(v, device="meta") for k, v in shapes.items()})
    except ValueError as e:
        raise DrafterLoadError(f"{where}: {e}") from None
    return {k: tuple(v.shape) for k, v in meta.items()}


def load_drafter(folder: str | Path, target: TargetAdapter, *, block_size: int | None = None) -> nn.Module:
    """Load a drafter folder for ``target``, validating everything (module docstring).

    ``block_size``, when given, must equal the drafter's (a drafter trained for γ
    slots predicts positions anchor+1..anchor+γ and nothing else). The drafter may read
    other feature layers than the adapter's default (they were validated to exist): the
    target is not changed, every forward gets ``layer_ids=drafter.target_layer_ids``.
    """
    folder = Path(folder)
    raw = read_config(folder)
    kind = kind_of_folder_config(raw, folder)
    check_config_fields(raw, folder, DrafterLoadError)
    _check_against_target(raw, kind, target, folder)
    if block_size is not None and raw["block_size"] != block_size:
        raise DrafterLoadError(
            f"{folder}: drafter block_size {raw['block_size']} != the requested {block_size}"
        )
    try:
        config = kind.config_from_fields(raw)
    except (ValueError, TypeError) as e:
        raise DrafterLoadError(f"{folder}: malformed drafter config: {e}") from None
    omitted: list[str] = []
    if RECORD_FIELD in raw:  # the target's tensors were left out of the file (shared_weights)
        try:
            omitted = check_record(raw[RECORD_FIELD], target)
        except ValueError as e:
            raise DrafterLoadError(f"{folder}: {e}") from None
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        raise DrafterLoadError(f"{folder}: no {WEIGHTS_NAME}")
    _verify_checksums(folder)
    # Sizes against the file's header before anything is allocated (folder_checks).
    shapes = _upgraded_shapes(_unalias_keys(header_shapes(weights, DrafterLoadError), folder), folder)
    if "d2t" in shapes:  # the file's draft vocabulary tables, the drafter's draft_ids
        shapes["draft_ids"] = shapes.pop("d2t")
        shapes.pop("t2d", None)
    check_weight_shapes(
        shapes,
        raw["num_hidden_layers"],
        lambda: kind.drafter_cls(
            resolve_target_fields(config, target, own_layers=True), drafter_dims(target, config)
        ),
        folder,
        DrafterLoadError,
        {k: raw[k] for k in SIZE_FIELDS if k in raw},
        omitted=tuple(omitted),
    )
    drafter = build_from_target(kind.drafter_cls, target, config, own_layers=True)
    try:
        state = load_file(str(weights))
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise DrafterLoadError(f"{weights}: cannot read weights ({e})") from None
    state = _unalias_keys(state, folder)
    try:
        state = from_file_state(upgrade_rnn_keys(state))
        if "draft_ids" in state and getattr(drafter, "draft_ids", None) is not None:
            set_draft_ids(drafter, state["draft_ids"].long(), target)  # the head takes the target's rows
    except ValueError as e:
        raise DrafterLoadError(f"{folder}: {e}") from None
    expected = drafter.state_dict()
    state.update({k: expected[k] for k in omitted})  # re-attached from the target (fingerprint checked)
    _check_state(state, expected, folder)
    check_finite(state, folder, DrafterLoadError)
    _check_shared_weights(state, target, folder)
    drafter.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)
    if getattr(drafter, "full_head", None) is not None:
        set_full_head(drafter, None)  # only training needs the target's full head (draft_vocab.py)
    return drafter.eval()


def with_sts_temperatures(config, temperatures: tuple[float, ...]):
    """A copy of a drafter config with fitted STS temperatures (DESIGN §8)."""
    return dataclasses.replace(config, sts_temperatures=tuple(float(t) for t in temperatures))


def convert_folder(src: str | Path, dst: str | Path, dtype: torch.dtype) -> Path:
    """Copy a drafter folder with its weights cast to ``dtype`` (e.g. bf16 to ship)."""
    src, dst = Path(src), Path(dst)
    raw = read_config(src)
    state = {k: v.contiguous() for k, v in cast_floating(load_file(str(src / WEIGHTS_NAME)), dtype).items()}
    raw["torch_dtype"] = str(dtype).removeprefix("torch.")
    tmp = temp_folder(dst)
    save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
    (tmp / CONFIG_NAME).write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    return _finish(tmp, dst, command="convert", inputs=[src])
