"""Cost-aware drafting: does drafting a request this step pay for itself? (an extension of SPEC §9)

Algorithm 1 sizes verification from SPS(B), but the drafter forward it verifies is
already paid for when it runs. On hardware where a forward costs in proportion to its
tokens (a CPU, or a GPU past its flat region) and the drafter is not negligible, the
best choice for a request with poor acceptance is not to draft at all. Before drafting,
request r is drafted iff for some verification length ℓ

    Σ_{k≤ℓ} â_{r,k}  >  ρ · (d + ℓ · m)

where ``â_{r,k} = e_r Π_{2≤i≤k} q_i`` is its predicted survival (``e_r`` its own
first-draft acceptance history, ``q_i`` the pooled conditional acceptance of position i),
``d`` the measured drafting time per request, ``m`` the marginal time of one more token
in the target forward at this batch (from the SPS table), and ``ρ = R / t(R)`` the
tokens per second that time buys without speculation. Left: expected extra tokens;
right: what the same time would produce by plain decoding.

Lossless: the decision reads only history (past outcomes, timings), never the drafts it
skips, like the difficulty-aware early exit it extends.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dspark.scheduler.profile import SpsTable


def marginal_token_s(sps: SpsTable, batch: int, span: int) -> float:
    """Seconds one more token adds to a forward of ``batch`` tokens, averaged over ``span`` more."""
    span = max(1, span)
    return max(0.0, (1.0 / sps(batch + span) - 1.0 / sps(batch)) / span)


def drafting_pays(
    first_accept: Tensor,
    later_rates: Tensor,
    *,
    draft_s: float,
    token_s: float,
    tokens_per_s: float,
) -> Tensor:
    """Which requests to draft: ``first_accept [R]``, ``later_rates [K-1]`` (positions 2..K) → ``[R]`` bool.

    ``draft_s``: drafting time per request; ``token_s``: marginal target time per verified
    token; ``tokens_per_s``: plain decoding's rate at this batch (ρ above).
    """
    K = later_rates.shape[0] + 1
    chain = torch.cat([torch.ones(1, dtype=torch.float64), later_rates.double().cumprod(0)])  # [K]
    survival = first_accept.double().unsqueeze(-1) * chain  # [R, K]: â_{r,k}
    gain = survival.cumsum(-1)  # [R, K]: expected accepted tokens when verifying ℓ = 1..K
    ell = torch.arange(1, K + 1, dtype=torch.float64)
    cost = tokens_per_s * (draft_s + ell * token_s)  # [K]: tokens plain decoding makes meanwhile
    return (gain > cost).any(-1)
