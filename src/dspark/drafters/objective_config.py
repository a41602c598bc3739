"""What a drafter is trained to minimise, as data (DESIGN §6; paper Eqs. 9-12).

Each trainable drafter's config carries one :class:`ObjectiveConfig`: which loss terms,
with which coefficients, under which position weighting. The losses themselves are
computed by the trainer (:func:`dspark.training.objective.compute_loss`), so the models
hold no training code and no code branches on a method name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ObjectiveConfig:
    """Coefficients of the loss terms and the position weighting of one drafter.

    ``ce``: hard cross-entropy on the ground-truth token (Eq. 9); ``tv``: L1 distance
    to the target distribution (Eq. 10); ``conf``: confidence BCE against the soft
    acceptance label (Eq. 11); ``soft_ce``: cross-entropy against the full target
    distribution (Eagle3). Exactly one of ``decay`` (δ) and ``geometric`` (r) is set.
    """

    ce: float = 0.0
    tv: float = 0.0
    conf: float = 0.0
    soft_ce: float = 0.0
    decay: float | None = 4.0
    geometric: float | None = None

    def __post_init__(self) -> None:
        if (self.decay is None) == (self.geometric is None):
            raise ValueError("set exactly one of decay (exp weighting) and geometric")
        if self.decay is not None and self.decay <= 0:
            raise ValueError(f"decay must be > 0, got {self.decay}")
        if self.geometric is not None and not 0 < self.geometric <= 1:
            raise ValueError(f"geometric must be in (0, 1], got {self.geometric}")
        if min(self.ce, self.tv, self.conf, self.soft_ce) < 0:
            raise ValueError("loss coefficients must be >= 0")


def dspark_objective(decay: float = 4.0) -> ObjectiveConfig:
    """``L = 0.1 L_ce + 0.9 L_tv + 1.0 L_conf`` (paper Eq. 12 defaults)."""
    return ObjectiveConfig(ce=0.1, tv=0.9, conf=1.0, decay=decay)


def dflash_objective(decay: float = 4.0) -> ObjectiveConfig:
    """DFlash: position-weighted cross-entropy only."""
    return ObjectiveConfig(ce=1.0, decay=decay)


def eagle3_objective(geometric: float = 0.8) -> ObjectiveConfig:
    """Eagle3: soft cross-entropy against the target distribution, step weight 0.8^k."""
    return ObjectiveConfig(soft_ce=1.0, decay=None, geometric=geometric)
