"""Training checkpoints: atomic, pickle-free, exactly resumable (DESIGN §5.4, §6).

A checkpoint is a folder ``<root>/step_00000042/`` that is also a Hugging Face model
folder, so a drafter can be evaluated or exported straight from it::

    config.json            the drafter config (model side)
    model.safetensors      model.state_dict(), every key, nothing else
    optimizer.safetensors  optimizer tensors, keyed "<param name>/<state name>"
    rng.safetensors        torch generator states, keyed "rank<r>/cpu", "rank<r>/cuda"
    rng.json               python / numpy generator states per rank
    trainer_state.json     step, scheduler, data position, optimizer param groups and
                           scalars, the identity (configs) a resume must match
    COMPLETE               written last: the file list and each file's sha256; a folder
                           without it is not a checkpoint

It is written into ``<root>/.tmp-step_...`` (each file fsynced), the marker last, then
renamed into place; ``<root>/latest`` (replaced atomically) names the newest. A crash at
any point leaves the previous checkpoint as ``latest``; the leftover temporary folder
is removed by the next save. Tensors go to safetensors and everything else to JSON, so
loading never unpickles. A resume verifies the checksums and falls back, with a warning,
to the newest checkpoint that is intact (flipped bytes, truncation, an emptied file);
``latest`` may only name a ``step_N`` folder beside it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from dspark.durable import fsync_path, write_atomic
from dspark.training.checkpoint_integrity import MARKER, CheckpointError, file_sha256, verify_checkpoint

log = logging.getLogger(__name__)

LATEST = "latest"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
_TMP_PREFIX = ".tmp-"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class ConfigMismatchError(CheckpointError):
    """Resuming with a configuration that differs from the checkpoint's."""


@dataclass
class RngState:
    """The generator states of one rank."""

    torch_cpu: Tensor  # uint8
    torch_cuda: Tensor | None  # uint8, the rank's current device
    python: list  # random.getstate() as JSON
    numpy: list  # np.random.get_state() as JSON


def capture_rng() -> RngState:
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return RngState(
        torch_cpu=torch.get_rng_state(),
        torch_cuda=torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        python=[py_version, list(py_state), py_gauss],
        numpy=[np_name, np_keys.tolist(), np_pos, np_has_gauss, np_gauss],
    )


def restore_rng(state: RngState) -> None:
    torch.set_rng_state(state.torch_cpu)
    if state.torch_cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state.torch_cuda)
    version, internal, gauss = state.python
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state.numpy
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


@dataclass
class Checkpoint:
    """The content of one checkpoint folder (optimizer state keyed by parameter name)."""

    step: int
    model_state: dict[str, Tensor]
    model_config: dict[str, Any]
    optimizer_state: dict[str, Any]  # {"state": {name: {key: value}}, "param_groups": [...]}
    rng: list[RngState]  # one per rank
    trainer_state: dict[str, Any] = field(default_factory=dict)  # JSON: scheduler, data, identity, ...
    path: Path | None = None


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


# -- writing --------------------------------------------------------------------------------


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _write_tensors(path: Path, tensors: Mapping[str, Tensor]) -> None:
    # safetensors refuses tensors that share storage (tied weights) or are views: copy those.
    seen: set[int] = set()
    out = {}
    for name, t in tensors.items():
        t = t.detach().cpu()
        if t.untyped_storage().data_ptr() in seen or not t.is_contiguous():
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    save_file(out, str(path), metadata={"format": "pt"})
    fsync_path(path)


def _write_marker(folder: Path, step: int) -> None:
    """The completion marker, with every file's sha256; written last, after every other file is durable."""
    files = sorted(p.name for p in folder.iterdir())
    _write_json(
        folder / MARKER, {"step": step, "files": files, "sha256": {f: file_sha256(folder / f) for f in files}}
    )


def _split_optimizer_state(state: Mapping[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    tensors, scalars = {}, {}
    for name, per_param in state["state"].items():
        for key, value in per_param.items():
            if isinstance(value, Tensor):
                tensors[f"{name}/{key}"] = value
            else:
                scalars.setdefault(name, {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _point_latest(root: Path, name: str) -> None:
    write_atomic(root / LATEST, name + "\n", tmp=root / f"{_TMP_PREFIX}{LATEST}")


def remove_incomplete(root: Path) -> None:
    """Delete temporary folders left by an interrupted save."""
    for p in root.glob(f"{_TMP_PREFIX}*"):
        log.warning("removing the leftover of an interrupted checkpoint save: %s", p)
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def save_checkpoint(root: str | Path, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` atomically under ``root`` and point ``latest`` at it; returns its folder.

    A write that fails (a full disk, a quota) removes its temporary folder and raises
    :class:`CheckpointError`; the previous checkpoint stays ``latest``.
    """
    root = Path(root)
    tmp = root / f"{_TMP_PREFIX}{step_dir_name(ckpt.step)}"
    try:
        return _save(root, tmp, ckpt)
    except (OSError, SafetensorError) as e:  # safetensors reports its I/O errors as its own type
        shutil.rmtree(tmp, ignore_errors=True)
        reason = getattr(e, "strerror", None) or str(e)
        raise CheckpointError(
            f"cannot write the step {ckpt.step} checkpoint under {root}: {reason}; the previous "
            "checkpoint is intact: free some space and rerun to resume"
        ) from None


def _save(root: Path, tmp: Path, ckpt: Checkpoint) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    remove_incomplete(root)
    name = step_dir_name(ckpt.step)
    tmp.mkdir()

    _write_json(tmp / CONFIG_FILE, ckpt.model_config)
    _write_tensors(tmp / WEIGHTS_FILE, ckpt.model_state)
    opt_tensors, opt_json = _split_optimizer_state(ckpt.optimizer_state)
    _write_tensors(tmp / "optimizer.safetensors", opt_tensors)
    rng_tensors = {f"rank{r}/cpu": s.torch_cpu for r, s in enumerate(ckpt.rng)}
    rng_tensors |= {f"rank{r}/cuda": s.torch_cuda for r, s in enumerate(ckpt.rng) if s.torch_cuda is not None}
    _write_tensors(tmp / "rng.safetensors", rng_tensors)
    _write_json(tmp / "rng.json", [{"python": s.python, "numpy": s.numpy} for s in ckpt.rng])
    _write_json(tmp / "trainer_state.json", {**ckpt.trainer_state, "step": ckpt.step, "optimizer": opt_json})
    _write_marker(tmp, ckpt.step)
    fsync_path(tmp)

    final = root / name
    if final.exists():  # re-saving a step (a resumed run passing an old one): swap it out first
        final.rename(root / f"{_TMP_PREFIX}old-{name}")
    os.rename(tmp, final)
    fsync_path(root)
    _point_latest(root, name)
    remove_incomplete(root)
    return final


# -- reading ---------------------------------------------------------------------------------


def is_complete(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, folder)``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and is_complete(p):
            found.append((int(m.group(1)), p))
    return sorted(found)


def _pointed(root: Path) -> Path | None:
    """The folder ``latest`` names: a ``step_N`` folder inside ``root``, never a path elsewhere."""
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    try:
        name = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        name = ""
    if not _STEP_DIR.match(name):
        log.warning("%s does not name a checkpoint folder of %s (%r); ignoring it", pointer, root, name[:80])
        return None
    folder = root / name
    if not is_complete(folder):
        log.warning("%s names %s, which is not a complete checkpoint; using the newest one", pointer, folder)
        return None
    return folder


def latest_checkpoint(root: str | Path, *, verify: bool = True) -> Path | None:
    """The checkpoint to resume from: the one ``latest`` names, else the newest complete one.

    With ``verify``, a candidate whose files fail :func:`verify_checkpoint` (flipped
    bytes, truncation) is skipped with a warning for the next newest valid one; None if
    none is valid and none exists, :class:`CheckpointError` if all that exist are corrupt.
    """
    root = Path(root)
    pointed = _pointed(root)
    candidates = [pointed] if pointed is not None else []
    candidates += [f for _, f in reversed(list_checkpoints(root)) if f != pointed]
    if not verify:
        return candidates[0] if candidates else None
    problems = []
    for folder in candidates:
        try:
            verify_checkpoint(folder)
        except CheckpointError as e:
            problems.append(str(e))
            log.warning("skipping a corrupt checkpoint: %s; falling back to an older one", e)
            continue
        if problems:
            log.warning("resuming from %s, the newest valid checkpoint", folder)
        return folder
    if problems:
        raise CheckpointError(f"no valid checkpoint under {root}: " + "; ".join(problems))
    return None


def _join_optimizer_state(tensors: Mapping[str, Tensor], opt_json: Mapping[str, Any]) -> dict[str, Any]:
    state: dict[str, dict[str, Any]] = {}
    for key, t in tensors.items():
        name, _, entry = key.rpartition("/")
        state.setdefault(name, {})[entry] = t
    for name, scalars in opt_json["scalars"].items():
        state.setdefault(name, {}).update(scalars)
    # JSON turns tuples (AdamW's betas) into lists; optimizers expect the tuples back.
    groups = [
        {k: (tuple(v) if isinstance(v, list) and k != "params" else v) for k, v in g.items()}
        for g in opt_json["param_groups"]
    ]
    return {"state": state, "param_groups": groups}


def load_checkpoint(folder: str | Path) -> Checkpoint:
    """Read a complete checkpoint folder (no unpickling anywhere); a corrupt one is a CheckpointError."""
    folder = Path(folder)
    if not is_complete(folder):
        raise CheckpointError(f"{folder} is not a complete checkpoint (no {MARKER} marker)")
    try:
        return _load(folder)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{folder}: corrupt checkpoint ({type(e).__name__}: {e})") from None
    except SafetensorError as e:
        raise CheckpointError(f"{folder}: corrupt checkpoint ({e})") from None


def _load(folder: Path) -> Checkpoint:
    trainer_state = json.loads((folder / "trainer_state.json").read_text())
    opt_json = trainer_state.pop("optimizer")
    rng_tensors = load_file(str(folder / "rng.safetensors"))
    rng_json = json.loads((folder / "rng.json").read_text())
    rng = [
        RngState(rng_tensors[f"rank{r}/cpu"], rng_tensors.get(f"rank{r}/cuda"), s["python"], s["numpy"])
        for r, s in enumerate(rng_json)
    ]
    return Checkpoint(
        step=int(trainer_state["step"]),
        model_state=load_file(str(folder / WEIGHTS_FILE)),
        model_config=json.loads((folder / CONFIG_FILE).read_text()),
        optimizer_state=_join_optimizer_state(load_file(str(folder / "optimizer.safetensors")), opt_json),
        rng=rng,
        trainer_state=trainer_state,
        path=folder,
    )


def prune_checkpoints(root: str | Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` complete checkpoints (never the one ``latest`` names)."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    latest = latest_checkpoint(root, verify=False)
    for _, folder in list_checkpoints(root)[:-keep_last]:
        if folder != latest:
            shutil.rmtree(folder)


# -- resume checks -------------------------------------------------------------------------


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out |= _flatten(v, f"{prefix}{k}.")
        return out
    return {prefix[:-1]: obj}


def config_differences(
    saved: Mapping[str, Any], current: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> list[str]:
    """``"field: saved -> current"`` for every dotted field that differs (compared as JSON).

    A field the saved identity lacks is no difference when its current value is its
    default in ``defaults`` (dotted too): a field added by a newer dspark, left at the
    default that keeps the old computation, does not block resuming an older run.
    """
    a = _flatten(json.loads(json.dumps(saved)))
    b = _flatten(json.loads(json.dumps(current)))
    d = _flatten(json.loads(json.dumps(defaults or {})))
    missing = object()
    return [
        f"{k}: {a.get(k, missing)!r} -> {b.get(k, missing)!r}".replace(repr(missing), "(absent)")
        for k in sorted(a.keys() | b.keys())
        if a.get(k, missing) != b.get(k, missing) and not (k not in a and k in d and b.get(k) == d[k])
    ]


def check_resumable(
    folder: Path,
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """Refuse to resume when the run's identity (configs, data, target) changed, naming the fields."""
    diffs = config_differences(saved, current, defaults)
    if diffs:
        raise ConfigMismatchError(
            f"cannot resume from {folder}: the configuration changed ({'; '.join(diffs)}). "
            "Restore those settings, or train into a new output directory."
        )
