"""Drafters built by name (SPEC §5): the one place that maps a method name to code.

``build_drafter("ngram", target)`` gives the prompt-lookup drafter; ``"none"`` gives
plain decoding. Trained drafters (``dflash``, ``dspark``, ``eagle3``) register their
loaders here as they are added; nothing outside this module branches on the name.
"""

from __future__ import annotations

from collections.abc import Callable

from dspark.drafters.ngram import NgramDrafter
from dspark.errors import DsparkError
from dspark.protocols import Drafter
from dspark.targets import TargetAdapter

DrafterFactory = Callable[[TargetAdapter], Drafter]

_FACTORIES: dict[str, DrafterFactory] = {
    "ngram": lambda target: NgramDrafter(target.vocab_size),
}


def register(name: str, factory: DrafterFactory) -> None:
    """Make ``build_drafter(name, target)`` call ``factory(target)``."""
    _FACTORIES[name] = factory


def available() -> list[str]:
    return ["none", *sorted(_FACTORIES)]


def build_drafter(spec: str | None, target: TargetAdapter) -> Drafter | None:
    """The drafter named by ``spec`` for ``target``; ``None``/``"none"`` = plain decoding."""
    if spec in (None, "", "none"):
        return None
    factory = _FACTORIES.get(spec)
    if factory is None:
        raise DsparkError(f"unknown drafter {spec!r}; choose from {', '.join(available())}")
    return factory(target)
