"""Drafters built by name (SPEC §5): the one place that maps a name to code.

``build_drafter(spec, target)`` takes:

- ``"none"`` — plain decoding (returns ``None``);
- ``"ngram"`` — the prompt-lookup drafter;
- ``"dflash" | "dspark" | "eagle3"`` — the drafter of that method shipped for the
  embedded tiny target (``dspark/assets/drafters/<name>``);
- a path — a drafter folder (SPEC §5.4), loaded with full validation.

The trainable methods themselves are listed in :mod:`dspark.drafters.kinds`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dspark.drafters.folder import load_drafter
from dspark.drafters.kinds import KINDS
from dspark.drafters.ngram import NgramDrafter
from dspark.errors import DsparkError
from dspark.presets.tiny import assets_dir
from dspark.protocols import Drafter
from dspark.targets import TargetAdapter

DrafterFactory = Callable[[TargetAdapter], Drafter]

_FACTORIES: dict[str, DrafterFactory] = {
    "ngram": lambda target: NgramDrafter(target.vocab_size),
}


def register(name: str, factory: DrafterFactory) -> None:
    """Make ``build_drafter(name, target)`` call ``factory(target)``."""
    _FACTORIES[name] = factory


def shipped_drafter_dir(method: str) -> Path:
    return assets_dir() / "drafters" / method


def available() -> list[str]:
    return ["none", *sorted(_FACTORIES), *sorted(KINDS)]


def build_drafter(spec: str | None, target: TargetAdapter) -> Drafter | None:
    """The drafter named by ``spec`` for ``target`` (see the module docstring)."""
    if spec in (None, "", "none"):
        return None
    if spec in _FACTORIES:
        return _FACTORIES[spec](target)
    if spec in KINDS:
        folder = shipped_drafter_dir(spec)
        if not (folder / "config.json").is_file():
            raise DsparkError(f"no shipped {spec} drafter at {folder}; train one with `dspark train`")
        return load_drafter(folder, target)
    path = Path(spec).expanduser()
    if path.is_dir():
        return load_drafter(path, target)
    raise DsparkError(f"unknown drafter {spec!r}: not one of {', '.join(available())}, nor a drafter folder")
