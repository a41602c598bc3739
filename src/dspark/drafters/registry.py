"""Drafters built by name (SPEC §5): the one place that maps a name to code.

``build_drafter(spec, target)`` takes:

- ``"none"`` — plain decoding (returns ``None``);
- ``"ngram"`` — the prompt-lookup drafter;
- ``"dflash" | "dspark" | "eagle3"`` — the drafter of that method shipped for the loaded
  target (``dspark/assets/drafters/<target>/<name>``, else the user's store
  ``~/.cache/dspark/drafters/<target>/<name>``: :mod:`dspark.drafters.shipped`);
- a path — a drafter folder (SPEC §5.4), loaded with full validation.

The trainable methods themselves are rows of :data:`dspark.drafters.kinds.KINDS`, a
table that imports no torch: :data:`TRAINABLE` and :data:`MASK_TOKEN_METHODS` are read
from it, so the CLI lists the drafters in ``--help`` at once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dspark.drafters.kinds import KINDS
from dspark.drafters.shipped import shipped_drafter_dir
from dspark.errors import DsparkError

if TYPE_CHECKING:
    from dspark.protocols import Drafter
    from dspark.targets import TargetAdapter

DrafterFactory = Callable[["TargetAdapter"], "Drafter"]

TRAINABLE = tuple(KINDS)  # the trainable methods, in the table's order
MASK_TOKEN_METHODS = tuple(k.name for k in KINDS.values() if k.uses_mask_token)  # block drafters


def _ngram(target: TargetAdapter) -> Drafter:
    from dspark.drafters.ngram import NgramDrafter

    return NgramDrafter(target.vocab_size)


_FACTORIES: dict[str, DrafterFactory] = {"ngram": _ngram}


def register(name: str, factory: DrafterFactory) -> None:
    """Make ``build_drafter(name, target)`` call ``factory(target)``."""
    _FACTORIES[name] = factory


def available() -> list[str]:
    """Every name :func:`build_drafter` takes besides a folder: none, training-free, trainable."""
    return ["none", *sorted(_FACTORIES), *sorted(TRAINABLE)]


def build_drafter(spec: str | None, target: TargetAdapter) -> Drafter | None:
    """The drafter named by ``spec`` for ``target`` (see the module docstring)."""
    from dspark.drafters.folder import load_drafter

    if spec in (None, "", "none"):
        return None
    if spec in _FACTORIES:
        return _FACTORIES[spec](target)
    if spec in TRAINABLE:
        return load_drafter(shipped_drafter_dir(spec, target), target)
    path = Path(spec).expanduser()
    if path.is_dir():
        return load_drafter(path, target)
    raise DsparkError(f"unknown drafter {spec!r}: not one of {', '.join(available())}, nor a drafter folder")
