"""Verification scheduling (SPEC §9): how many drafts of each request to verify per step.

Pure functions of confidences, per-request caps and a profiled SPS table; nothing here
knows about models (``scheduler`` never imports ``targets`` or ``drafters``).
"""

from dspark.scheduler.confidence_estimator import (
    ConfidenceEstimator,
    EstimatorConfig,
    FirstAcceptPredictor,
)
from dspark.scheduler.drafting import drafting_pays, marginal_token_s
from dspark.scheduler.payoff import (
    AcceptanceRecord,
    Choice,
    PayoffConfig,
    PayoffController,
    RoundCosts,
    best_length,
    shadow_outcome,
)
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
    "AcceptanceRecord",
    "Choice",
    "PayoffConfig",
    "PayoffController",
    "RoundCosts",
    "best_length",
    "shadow_outcome",
    "ConfidenceEstimator",
    "EstimatorConfig",
    "FirstAcceptPredictor",
    "POLICIES",
    "Policy",
    "PolicyRule",
    "StepInputs",
    "SpsTable",
    "default_sizes",
    "drafting_pays",
    "fixed_lengths",
    "global_search",
    "marginal_token_s",
    "measure_sps",
    "parse_policy",
    "prefix_async_lengths",
    "prefix_lengths",
    "schedule",
    "stale_history",
    "survival",
    "threshold_lengths",
]
