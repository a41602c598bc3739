"""Sampling: logits → probabilities (probs.py) and lossless verification (rejection.py, SPEC §3)."""

from dspark.sampling.probs import batch_probs, process_logits
from dspark.sampling.rejection import (
    VerifyOutput,
    acceptance_probability,
    residual_distribution,
    sample_inverse_cdf,
    verify,
    verify_greedy,
)

__all__ = [
    "VerifyOutput",
    "acceptance_probability",
    "batch_probs",
    "process_logits",
    "residual_distribution",
    "sample_inverse_cdf",
    "verify",
    "verify_greedy",
]
