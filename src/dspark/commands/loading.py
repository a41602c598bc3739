"""From command-line values to library objects: the target, the drafters, the training records.

Every verb that takes ``--target``, ``--drafter(s)`` or ``--data`` resolves it here, so
the rules (``tiny`` or nothing is the embedded target; a drafter is a registered name or
a folder; ``tiny-corpus`` is the tiny target's own corpus) are written once.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig

from dspark.commands.argtypes import TINY_CORPUS
from dspark.data.records import read_jsonl
from dspark.drafters.registry import TRAINABLE
from dspark.errors import DsparkError
from dspark.formats.build import build_drafter
from dspark.formats.shipped import shipped_drafter_dir
from dspark.presets.tiny import TINY_TARGET_NAME, resolve_target
from dspark.targets import TargetAdapter
from dspark.targets.dtype import inference_dtype
from dspark.tiny.corpus import training_records as corpus_records


def set_threads(threads: int | None) -> None:
    """``--threads N`` of a subcommand: torch's intra-op thread count (None: leave it)."""
    if threads:
        torch.set_num_threads(threads)


def is_tiny(spec: str | None) -> bool:
    return spec in (None, "", TINY_TARGET_NAME)


def load_target(spec: str | None, **kwargs) -> TargetAdapter:
    """The target named by ``--target`` (``None``/``tiny``: the embedded one), loaded."""
    return TargetAdapter.from_pretrained(resolve_target(spec), **kwargs)


def load_inference_target(spec: str | None, dtype: str | None = "auto", device=None) -> TargetAdapter:
    """The target of a decoding command in the dtype of ``--dtype`` (``auto``: see ``targets/dtype.py``)."""
    hidden = target_hidden_size(spec) if dtype in (None, "auto") else None
    return load_target(spec, dtype=inference_dtype(dtype, device, hidden_size=hidden), device=device)


def target_hidden_size(spec: str | None) -> int | None:
    """The hidden size in the config of ``--target`` (None when it cannot be read before loading)."""
    try:
        config = AutoConfig.from_pretrained(resolve_target(spec))
    except Exception:  # noqa: BLE001 - a malformed config fails anywhere in HF; load_target reports it
        return None
    return getattr(config.get_text_config(), "hidden_size", None)


def parse_drafter_specs(text: str) -> dict[str, str]:
    """``"dspark,dflash=runs/a/drafter"`` → ``{"dspark": "dspark", "dflash": "runs/a/drafter"}``.

    An unnamed folder is labelled by its name (its parent's for a run's ``drafter/``).
    """
    specs: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        label, sep, spec = item.partition("=")
        if not sep:
            spec = item
            path = Path(item)
            label = (
                item if len(path.parts) == 1 else (path.parent.name if path.name == "drafter" else path.name)
            )
        if not label or not spec:
            raise DsparkError(f"bad drafter {item!r}: expected NAME, PATH or LABEL=NAME_OR_PATH")
        if label in specs:
            raise DsparkError(f"two drafters are labelled {label!r}; name them with LABEL=PATH")
        specs[label] = spec
    if not specs:
        raise DsparkError("no drafters given")
    return specs


def load_drafters(specs: dict[str, str], target) -> dict:
    """Every drafter of ``specs`` for ``target``; ``load_drafter`` refuses one made for another
    target (fields, keys, shared weights)."""
    return {label: build_drafter(spec, target) for label, spec in specs.items()}


def drafter_folder(spec: str, target=None) -> Path:
    """The folder of a trained drafter: a shipped method's for ``target`` (the tiny target's
    when None), or ``spec`` itself."""
    return shipped_drafter_dir(spec, target) if spec in TRAINABLE else Path(spec).expanduser()


def training_records(specs: list[str], limit: int | None = None) -> list[dict]:
    """The records of ``--data``: JSONL files, or ``tiny-corpus``; the first ``limit``."""

    records: list[dict] = []
    for spec in specs:
        if spec == TINY_CORPUS:
            records += corpus_records()
        else:
            if not Path(spec).is_file():
                raise DsparkError(f"no data file {spec!r}")
            records += read_jsonl(spec)
    return records[:limit] if limit else records
