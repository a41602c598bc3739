"""Sampling: logits → probabilities (probs.py), the greedy token (argmax.py) and lossless verification
(rejection.py, DESIGN §3)."""

from dspark.sampling.argmax import greedy_tokens
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
    "greedy_tokens",
    "process_logits",
    "residual_distribution",
    "sample_inverse_cdf",
    "verify",
    "verify_greedy",
]
