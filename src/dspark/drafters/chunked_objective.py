"""The draft-logit terms of the objective, chunk by chunk, with their gradients in closed form.

SPEC §6 and issues 14/16. The dense path (:func:`dspark.drafters.objective.compute_loss`
on materialized logits) holds several ``[B, A, K, V]`` fp32 tensors through the
backward pass: draft logits, log-probabilities, probabilities, the target's, the L1
difference and autograd's saved copies. Here the slots go through in chunks; for each
chunk the LM head runs, the per-slot terms are computed, and so is their gradient with
respect to the logits, which is immediately pulled back through the (frozen) head into
the small inputs — the draft hidden state ``[.., H]`` and the sequential head's factor
``[.., r]`` — so that nothing of size V outlives its chunk.

With ``z`` the draft logits of a slot, ``p = softmax(z)``, ``q`` the target's
distribution, ``s = sign(p - q)`` and the slot's weight ``ω`` (position weight × valid,
normalised as in :func:`~dspark.drafters.objective.weighted_mean`):

- CE (Eq. 9), ``-log p[x*]``:                 ``∂/∂z = p - e_{x*}``
- soft CE (Eagle3), ``-Σ q log p``:            ``∂/∂z = p - q``
- TV (Eq. 10), ``‖p - q‖₁``:                   ``∂/∂z = p ⊙ (s - ⟨s, p⟩)``

(sign(0) = 0, as autograd's ``abs`` uses), times ``1 - (z/c)²`` under a softcap ``c``.
The confidence term (Eq. 11) does not touch the logits: its soft label ``c* = 1 - ½‖p - q‖₁``
is detached, so it is left to autograd on the confidences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dspark.protocols import SlotFactors

DEFAULT_BUDGET_BYTES = 512 << 20  # V-sized working set of one chunk
_LIVE_V_TENSORS = 8  # fp32 [chunk, V] tensors alive at once inside a chunk (z, logp, p, q, diff, g, ...)


def chunk_slots(vocab_size: int, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> int:
    """Slots per chunk so that a chunk's V-sized tensors fit ``budget_bytes``."""
    return max(1, budget_bytes // (vocab_size * 4 * _LIVE_V_TENSORS))


@dataclass(frozen=True)
class SlotTerms:
    """Per-slot values ``[M]`` (detached) and the weighted objective part that depends on the logits."""

    objective: Tensor  # scalar, Σ ω (α_ce ce + α_soft soft + α_tv l1), with grad
    l1: Tensor  # [M] ‖p - q‖₁
    ce: Tensor | None  # [M], when α_ce > 0
    soft_ce: Tensor | None  # [M], when α_soft > 0


def _softcap(z: Tensor, cap: float | None) -> Tensor:
    return z if cap is None else cap * torch.tanh(z / cap)


class _ChunkedTerms(torch.autograd.Function):
    """Forward: per-slot terms chunk by chunk, and their gradients; backward: scale the saved gradients."""

    @staticmethod
    def forward(ctx, hidden, u, w2, head, target_rows, target_index, labels, omega, coefs, softcap, chunk):
        a_ce, a_soft, a_tv = coefs
        need_grad = any(x is not None and x.requires_grad for x in (hidden, u, w2))
        M = hidden.shape[0]
        head32 = head.float()  # [V, H]
        w2_32 = w2.float() if w2 is not None else None  # [V, r]
        l1 = hidden.new_empty(M, dtype=torch.float32)
        ce = hidden.new_empty(M, dtype=torch.float32) if a_ce else None
        soft = hidden.new_empty(M, dtype=torch.float32) if a_soft else None
        grad_h = torch.zeros_like(hidden, dtype=torch.float32) if need_grad else None
        grad_u = torch.zeros_like(u, dtype=torch.float32) if need_grad and u is not None else None
        grad_w2 = torch.zeros_like(w2_32) if need_grad and w2 is not None else None
        # In-place updates and fused row reductions below: on a CPU the [chunk, V] passes,
        # not the matmuls, would otherwise dominate.
        for start in range(0, M, chunk):
            sl = slice(start, start + chunk)
            z = hidden[sl].float() @ head32.T  # [c, V]
            if u is not None:
                z.addmm_(u[sl].float(), w2_32.T)
            z = _softcap(z, softcap)
            logp = torch.log_softmax(z, dim=-1)  # [c, V]
            p = logp.exp()
            rows, inverse = torch.unique(
                target_index[sl], return_inverse=True
            )  # overlapping blocks share rows
            q = torch.softmax(_softcap(target_rows[rows].float() @ head32.T, softcap), dim=-1)[
                inverse
            ]  # [c, V]
            label = labels[sl].unsqueeze(-1)  # [c, 1]
            if a_ce:
                ce[sl] = -logp.gather(-1, label).squeeze(-1)
            if a_soft:
                soft[sl] = -torch.linalg.vecdot(q, logp)
            del logp
            diff = p - q  # [c, V]
            l1[sl] = torch.linalg.vector_norm(diff, ord=1, dim=-1)
            if not need_grad:
                continue
            g = diff.sign_()  # s; the gradient is built in its storage
            g.sub_(torch.linalg.vecdot(g, p).unsqueeze(-1)).mul_(a_tv).add_(a_ce + a_soft).mul_(p)
            if a_soft:
                g.sub_(q, alpha=a_soft)
            if a_ce:
                g.scatter_add_(-1, label, torch.full_like(label, -a_ce, dtype=g.dtype))
            g.mul_(omega[sl].unsqueeze(-1))
            if softcap is not None:
                g.mul_(1.0 - (z / softcap) ** 2)
            grad_h[sl] = g @ head32
            if u is not None:
                grad_u[sl] = g @ w2_32
                grad_w2.addmm_(g.T, u[sl].float())
        per_slot = a_tv * l1
        if a_ce:
            per_slot = per_slot + a_ce * ce
        if a_soft:
            per_slot = per_slot + a_soft * soft
        objective = (omega * per_slot).sum()
        ctx.dtypes = (hidden.dtype, u.dtype if u is not None else None, w2.dtype if w2 is not None else None)
        ctx.save_for_backward(*(t if t is not None else torch.empty(0) for t in (grad_h, grad_u, grad_w2)))
        ctx.has = (grad_h is not None, grad_u is not None, grad_w2 is not None)
        outputs = [t for t in (l1, ce, soft) if t is not None]
        ctx.mark_non_differentiable(*outputs)
        return objective, l1, ce, soft

    @staticmethod
    def backward(ctx, grad_objective, *unused):
        grads = []
        for saved, has, dtype in zip(ctx.saved_tensors, ctx.has, ctx.dtypes):
            grads.append((grad_objective * saved).to(dtype) if has else None)
        return (*grads, None, None, None, None, None, None, None, None)


def chunked_terms(
    factors: SlotFactors,
    labels: Tensor,
    omega: Tensor,
    *,
    ce: float,
    soft_ce: float,
    tv: float,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> SlotTerms:
    """The logit-dependent terms of every slot of ``factors`` (shapes ``[B, A, K]`` flattened to ``[M]``).

    ``omega [B, A, K]`` are the slots' normalised weights (0 where not supervised); the
    returned ``objective`` is ``Σ ω (ce·CE + soft_ce·softCE + tv·L1)`` and backpropagates
    into ``factors.hidden``, ``low_rank_u`` and ``low_rank_w``.
    """
    shape = labels.shape
    H = factors.hidden.shape[-1]
    u = factors.low_rank_u
    # fp32 throughout, also inside the trainer's bf16 autocast (whose matmuls would be bf16).
    with torch.autocast(factors.hidden.device.type, enabled=False):
        objective, l1, ce_t, soft_t = _ChunkedTerms.apply(
            factors.hidden.reshape(-1, H),
            u.reshape(-1, u.shape[-1]) if u is not None else None,
            factors.low_rank_w,
            factors.head,
            factors.target_rows,
            factors.target_index.reshape(-1),
            labels.reshape(-1),
            omega.reshape(-1).float(),
            (ce, soft_ce, tv),
            factors.softcap,
            chunk_slots(factors.head.shape[0], budget_bytes),
        )
    return SlotTerms(
        objective=objective,
        l1=l1.view(shape),
        ce=ce_t.view(shape) if ce_t is not None else None,
        soft_ce=soft_t.view(shape) if soft_t is not None else None,
    )
