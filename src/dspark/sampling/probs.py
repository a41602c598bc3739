"""From logits to the sampling distribution: temperature, top-k, top-p (DESIGN §3, §10).

The same processing is applied to the target's and the drafter's logits, so that
rejection sampling (``rejection.py``) preserves the *processed* target distribution.
Everything runs in fp32 whatever the logits' dtype.

Order of operations, per row:

1. temperature ``T``: ``logits / T``; ``T == 0`` means greedy and yields a one-hot row at
   the argmax of the raw logits (ties: the lowest token id);
2. top-k (``k > 0``): keep the ``k`` most likely tokens (exactly ``k``; among equal
   logits the lowest token ids come first, as for the greedy argmax);
3. top-p (``p < 1``): of what top-k kept, keep the smallest most-likely-first set whose
   probability mass is ``>= p``; the most likely token is always kept;
4. softmax over the kept tokens; every other token gets probability exactly 0.
"""

from __future__ import annotations

import torch

from dspark.protocols import SamplingParams
from dspark.sampling.argmax import greedy_tokens


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities ``[..., V]`` (fp32, rows sum to 1) for one set of sampling params."""
    if params.temperature == 0:  # greedy: what _process returns, without the softmax
        return greedy_one_hot(logits)
    device = logits.device
    return _process(
        logits,  # [..., V]
        temperature=torch.tensor(params.temperature, dtype=torch.float32, device=device),
        top_k=torch.tensor(params.top_k, dtype=torch.long, device=device),
        top_p=torch.tensor(params.top_p, dtype=torch.float32, device=device),
    )


def batch_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Probabilities ``[R, T, V]`` for logits ``[R, T, V]`` with per-request params.

    One pass over the whole batch either way: when every request has the same
    temperature/top-k/top-p the scalars are used, otherwise per-request ``[R, 1, 1]``
    tensors broadcast over T and V.
    """
    assert logits.dim() == 3, f"logits must be [R, T, V], got {tuple(logits.shape)}"
    R = logits.shape[0]
    assert len(params) == R, f"{len(params)} sampling params for {R} requests"
    if R > 0 and len({(p.temperature, p.top_k, p.top_p) for p in params}) == 1:
        return process_logits(logits, params[0])
    device = logits.device

    def per_request(values: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device).view(R, 1, 1)  # [R, 1, 1]

    return _process(
        logits,
        temperature=per_request([p.temperature for p in params], torch.float32),
        top_k=per_request([p.top_k for p in params], torch.long),
        top_p=per_request([p.top_p for p in params], torch.float32),
    )


def greedy_one_hot(logits: torch.Tensor) -> torch.Tensor:
    """Greedy "probabilities" ``[..., V]`` fp32: one-hot at the raw logits' argmax (ties: lowest id)."""
    probs = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    return probs.scatter_(-1, greedy_tokens(logits).unsqueeze(-1), 1.0)


def _process(
    logits: torch.Tensor, *, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Core of both entry points; the three params are scalars or ``[R, 1, 1]``."""
    x = logits.float()  # [..., V]
    greedy = temperature == 0  # scalar or [R, 1, 1]
    x = x / torch.where(greedy, torch.ones_like(temperature), temperature)
    if bool((top_k > 0).any()) or bool((top_p < 1).any()):
        x = x.masked_fill(~_top_k_top_p_keep(x, top_k, top_p), float("-inf"))
    probs = torch.softmax(x, dim=-1)  # [..., V]
    if bool(greedy.any()):
        probs = torch.where(greedy, greedy_one_hot(logits), probs)
    return probs


def _top_k_top_p_keep(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Boolean mask ``[..., V]`` of the tokens that survive top-k then top-p."""
    V = x.shape[-1]
    sorted_x, order = x.sort(dim=-1, descending=True, stable=True)  # [..., V]; ties: lowest id first
    rank = torch.arange(V, device=x.device)  # [V]
    # top_k/top_p are scalars or [R, 1, 1]: both broadcast against [..., V] as they are.
    keep = rank < torch.where(top_k > 0, top_k, V)  # [..., V] in sorted order; k == 0 is off
    # Top-p on the top-k-renormalised distribution: keep a token while the mass strictly
    # before it is < p, i.e. the smallest prefix with mass >= p. Rank 0 has mass 0 before
    # it, so the argmax is always kept. p == 1 is "off": fp cumsum could reach 1.0 early
    # and cut a tail of tiny tokens, so those rows skip the test.
    sorted_probs = torch.softmax(sorted_x.masked_fill(~keep, float("-inf")), dim=-1)  # [..., V]
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [..., V]
    # Rank 0 is kept outright: a top_p that underflows to 0 in fp32 must not empty the row.
    keep = keep & ((mass_before < top_p) | (top_p >= 1) | (rank == 0))
    return torch.zeros_like(keep).scatter(-1, order, keep)  # back to token order
