"""Verification scheduling (DESIGN §9): how many drafts of each request to verify per step.

Pure functions of confidences, per-request caps and a profiled SPS table; nothing here
knows about models (``scheduler`` never imports ``targets`` or ``drafters``).
"""

from dspark.scheduler.confidence_estimator import ConfidenceEstimator, EstimatorConfig
from dspark.scheduler.controller import Controller, ControllerConfig, Offer, RoundCosts, Spec
from dspark.scheduler.policies import (
    POLICIES,
    Policy,
    PolicyRule,
    StepInputs,
    fixed_lengths,
    global_search,
    parse_policy,
    prefix_async_lengths,
    prefix_lengths,
    schedule,
    stale_history,
    survival,
    threshold_lengths,
)
from dspark.scheduler.profile import SpsTable, default_sizes, measure_sps

__all__ = [
    "Controller",
    "ControllerConfig",
    "Offer",
    "RoundCosts",
    "Spec",
    "ConfidenceEstimator",
    "EstimatorConfig",
    "POLICIES",
    "Policy",
    "PolicyRule",
    "StepInputs",
    "SpsTable",
    "default_sizes",
    "fixed_lengths",
    "global_search",
    "measure_sps",
    "parse_policy",
    "prefix_async_lengths",
    "prefix_lengths",
    "schedule",
    "stale_history",
    "survival",
    "threshold_lengths",
]
