"""Verification scheduling and the speculation controller (DESIGN §9).

Pure functions and plain state over confidences, acceptance counts, per-request caps and
measured seconds; nothing here knows about models (``scheduler`` never imports ``targets``
or ``drafters``).
"""

from dspark.scheduler.confidence_estimator import ConfidenceEstimator, EstimatorConfig
from dspark.scheduler.controller import Controller, ControllerConfig, Offer, RoundCosts, Spec
from dspark.scheduler.policies import (
    POLICIES,
    Policy,
    global_search,
    parse_policy,
    prefix_lengths,
    schedule,
    stale_history,
)
from dspark.scheduler.profile import SpsTable, default_sizes, measure_sps

__all__ = [
    "POLICIES",
    "ConfidenceEstimator",
    "Controller",
    "ControllerConfig",
    "EstimatorConfig",
    "Offer",
    "Policy",
    "RoundCosts",
    "Spec",
    "SpsTable",
    "default_sizes",
    "global_search",
    "measure_sps",
    "parse_policy",
    "prefix_lengths",
    "schedule",
    "stale_history",
]
