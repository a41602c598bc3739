"""A drafter by name or folder (DESIGN §5): what ``--drafter`` accepts.

``build_drafter(spec, target)`` takes:

- ``"none"`` — plain decoding (returns ``None``);
- a registered training-free drafter (``"ngram"``: the prompt-lookup drafter,
  :mod:`dspark.drafters.registry`);
- ``"dflash" | "dspark" | "eagle3"`` — the drafter of that method shipped for the loaded
  target (``dspark/assets/drafters/<target>/<name>``, else the user's store
  ``~/.cache/dspark/drafters/<target>/<name>``: :mod:`dspark.formats.shipped`);
- a path — a drafter folder (DESIGN §5.4), loaded with full validation.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dspark.drafters.registry import TRAINABLE, available, factory
from dspark.errors import DsparkError
from dspark.formats.folder import load_drafter
from dspark.formats.shipped import shipped_drafter_dir

if TYPE_CHECKING:
    from dspark.protocols import Drafter
    from dspark.targets import TargetAdapter


def build_drafter(spec: str | None, target: TargetAdapter) -> Drafter | None:
    """The drafter named by ``spec`` for ``target`` (see the module docstring)."""
    if spec in (None, "", "none"):
        return None
    if (make := factory(spec)) is not None:
        return make(target)
    if spec in TRAINABLE:
        return load_drafter(shipped_drafter_dir(spec, target), target)
    path = Path(spec).expanduser()
    if path.is_dir():
        return load_drafter(path, target)
    raise DsparkError(f"unknown drafter {spec!r}: not one of {', '.join(available())}, nor a drafter folder")
