"""Drafter names (DESIGN §5): the one place that maps a name to code.

The training-free drafters are factories registered by name (``"ngram"``); the trainable
methods are rows of :data:`dspark.drafters.kinds.KINDS`. Loading a drafter by name or folder
(the shipped drafter of a method, a folder on disk) is :func:`dspark.formats.build.build_drafter`,
which reads this table. :data:`~dspark.drafters.kinds.KINDS` imports no torch:
:data:`TRAINABLE` and :data:`MASK_TOKEN_METHODS` are read from it, so the CLI lists the
drafters in ``--help`` at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dspark.drafters.kinds import KINDS

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
    """Make ``build_drafter(name, target)`` (:mod:`dspark.formats.build`) call ``factory(target)``."""
    _FACTORIES[name] = factory


def available() -> list[str]:
    """Every name ``build_drafter`` takes besides a folder: none, training-free, trainable."""
    return ["none", *sorted(_FACTORIES), *sorted(TRAINABLE)]


def factory(name: str) -> DrafterFactory | None:
    """The registered factory of the training-free drafter ``name``, or None."""
    return _FACTORIES.get(name)
