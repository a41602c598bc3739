"""The draft-logit terms of the objective, chunk by chunk, with their gradients in closed form.

DESIGN §6. The dense path (:func:`dspark.training.objective.compute_loss`
on materialized logits) holds several ``[B, A, K, V]`` fp32 tensors through the
backward pass: draft logits, log-probabilities, probabilities, the target's, the L1
difference and autograd's saved copies. Here the slots go through in chunks; for each
chunk the LM head runs, the per-slot terms are computed, and so is their gradient with
respect to the logits, which is immediately pulled back through the (frozen) head into
the small inputs — the draft hidden state ``[.., H]`` and the sequential head's factor
``[.., r]`` — so that nothing of size V outlives its chunk.

With ``z`` the draft logits of a slot, ``p = softmax(z)``, ``q`` the target's
distribution, ``s = sign(p - q)`` and the slot's weight ``ω`` (position weight × valid,
normalised as in :func:`~dspark.training.objective.weighted_mean`):

- CE (Eq. 9), ``-log p[x*]``:                 ``∂/∂z = p - e_{x*}``
- soft CE (Eagle3), ``-Σ q log p``:            ``∂/∂z = p - q``
- TV (Eq. 10), ``‖p - q‖₁``:                   ``∂/∂z = p ⊙ (s - ⟨s, p⟩)``

(sign(0) = 0, as autograd's ``abs`` uses), times ``1 - (z/c)²`` under a softcap ``c``.

Over a reduced draft vocabulary D (:mod:`dspark.drafters.draft_vocab`), ``z``/``p`` are
``[N]``, ``q`` is the target's full softmax restricted to D (not renormalised) and the
L1 term adds the constant ``q(V∖D)``; CE drops a slot whose label is outside D
(``ce_mask``); soft CE uses ``q_D / q(D)``. The gradients above hold with these ``q``.
The confidence term (Eq. 11) does not touch the logits: its soft label ``c* = 1 - ½‖p - q‖₁``
is detached, so it is left to autograd on the confidences.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from dspark.drafters.draft_vocab import target_to_draft
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


# exp(x) for x below about -87 is a subnormal float or 0, and torch's vectorised exp takes a
# slow path for it (10-20x, flush-to-zero or not; BENCHMARKS.md). Trained drafters'
# logits span far more than 87 nats, so every softmax below clamps its exponent here first:
# each probability under 1.7e-38 rises to it, far below the objective's float noise.
EXP_FLOOR = -87.0


def _log_softmax(z: Tensor) -> tuple[Tensor, Tensor]:
    """``(log p, p)`` of ``softmax(z)`` over the last dimension, with :data:`EXP_FLOOR`."""
    logp = z - z.amax(dim=-1, keepdim=True)
    p = logp.clamp_min(EXP_FLOOR).exp_()
    total = p.sum(dim=-1, keepdim=True)
    return logp.sub_(total.log()), p.div_(total)


def _softmax(z: Tensor) -> Tensor:
    """``softmax(z)`` over the last dimension, with :data:`EXP_FLOOR`."""
    p = (z - z.amax(dim=-1, keepdim=True)).clamp_min_(EXP_FLOOR).exp_()
    return p.div_(p.sum(dim=-1, keepdim=True))


# Copies of a frozen head (in the products' dtype, its draft rows), kept while the head lives
# unchanged: casting a [V, H] head per micro-batch cost more than the products it feeds.
_DERIVED: dict[tuple[int, str], tuple[weakref.ref, int, Tensor]] = {}


def _frozen(t: Tensor, what: str, make) -> Tensor:
    """``make(t)``, computed once per frozen ``t`` (recomputed for a trained one)."""
    if t.requires_grad:  # trained: its values change every step
        return make(t.detach())
    key = (id(t), what)
    hit = _DERIVED.get(key)
    if hit is not None and hit[0]() is t and hit[1] == t._version:
        return hit[2]
    for k in [k for k, v in _DERIVED.items() if v[0]() is None]:
        del _DERIVED[k]
    _DERIVED[key] = (weakref.ref(t), t._version, out := make(t.detach()))
    return out


def _cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    return t if t.dtype == dtype else _frozen(t, str(dtype), lambda x: x.to(dtype))


class _ChunkedTerms(torch.autograd.Function):
    """Forward: per-slot terms chunk by chunk, and their gradients; backward: scale the saved gradients."""

    @staticmethod
    def forward(
        ctx,
        hidden,
        u,
        w2,
        head,
        target_rows,
        target_index,
        labels,
        omega,
        coefs,
        softcap,
        chunk,
        reduced,
        mm_dtype,
    ):
        a_ce, a_soft, a_tv = coefs
        target_head, draft_ids, ce_mask = reduced  # all None for the full vocabulary
        need_grad = any(x is not None and x.requires_grad for x in (hidden, u, w2))
        M = hidden.shape[0]
        # The products run in mm_dtype (bf16 where the trainer runs bf16: a CPU with AMX does
        # them 5-8x faster than fp32) and everything of size V after them in fp32.
        head_mm = _cast(head, mm_dtype)  # [V, H] ([N, H] over a reduced draft vocabulary)
        target_mm = head_mm if target_head is None else _cast(target_head, mm_dtype)  # [V, H]
        w2_mm = _cast(w2, mm_dtype) if w2 is not None else None  # [V, r]
        l1 = hidden.new_empty(M, dtype=torch.float32)
        ce = hidden.new_empty(M, dtype=torch.float32) if a_ce else None
        soft = hidden.new_empty(M, dtype=torch.float32) if a_soft else None
        grad_h = torch.zeros_like(hidden, dtype=torch.float32) if need_grad else None
        grad_u = torch.zeros_like(u, dtype=torch.float32) if need_grad and u is not None else None
        grad_w2 = torch.zeros_like(w2, dtype=torch.float32) if need_grad and w2 is not None else None
        # In-place updates and fused row reductions below: on a CPU the [chunk, V] passes,
        # not the matmuls, would otherwise dominate.
        target = _TargetProbs(target_rows, target_index, target_mm, draft_ids, softcap, mm_dtype)
        for start in range(0, M, chunk):
            sl = slice(start, start + chunk)
            h = hidden[sl].to(mm_dtype)  # [c, H]
            z = (h @ head_mm.T).float()  # [c, V]
            if u is not None:
                u_c = u[sl].to(mm_dtype)  # [c, r]
                z += u_c @ w2_mm.T
            z = _softcap(z, softcap)
            logp, p = _log_softmax(z)  # [c, V]
            q, mass = target.at(sl)
            q_soft, outside = q, None
            if mass is not None:
                outside = (1.0 - mass).clamp_min(0.0)  # q(V∖D): never proposable, always rejected
                q_soft = q / mass.clamp_min(1e-30).unsqueeze(-1) if a_soft else None
            label = labels[sl].unsqueeze(-1)  # [c, 1]
            if a_ce:
                ce[sl] = -logp.gather(-1, label).squeeze(-1)
                if ce_mask is not None:
                    ce[sl] *= ce_mask[sl]
            if a_soft:
                soft[sl] = -torch.linalg.vecdot(q_soft, logp)
            del logp
            diff = p - q  # [c, V]
            l1[sl] = torch.linalg.vector_norm(diff, ord=1, dim=-1)
            if outside is not None:
                l1[sl] += outside
            if not need_grad:
                continue
            g = diff.sign_()  # s; the gradient is built in its storage
            g.sub_(torch.linalg.vecdot(g, p).unsqueeze(-1)).mul_(a_tv)
            if ce_mask is None:
                g.add_(a_ce + a_soft).mul_(p)
            else:  # CE only where the label is in the draft vocabulary
                g.add_((a_ce * ce_mask[sl] + a_soft).unsqueeze(-1)).mul_(p)
            if a_soft:
                g.sub_(q_soft, alpha=a_soft)
            if a_ce:
                step = torch.full_like(label, -a_ce, dtype=g.dtype)
                if ce_mask is not None:
                    step = step * ce_mask[sl].unsqueeze(-1)
                g.scatter_add_(-1, label, step)
            g.mul_(omega[sl].unsqueeze(-1))
            if softcap is not None:
                g.mul_(1.0 - (z / softcap) ** 2)
            g_mm = g.to(mm_dtype)
            grad_h[sl] = g_mm @ head_mm
            if u is not None:
                grad_u[sl] = g_mm @ w2_mm
                grad_w2 += g_mm.T @ u_c
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
        return (*grads, None, None, None, None, None, None, None, None, None, None)


class _TargetProbs:
    """The target's distribution at every slot: ``q [c, V]`` for a chunk of slots, or over a
    draft vocabulary ``q_D [c, N]`` (not renormalised) and its mass ``q(D) [c]``.

    Overlapping blocks share target positions, so the head runs once per distinct row. Over
    a draft vocabulary the normaliser ``log Σ_V exp`` of every distinct row is computed up
    front, a slice of the vocabulary at a time (each slice of the head is read once, and the
    ``[rows, slice]`` passes stay in the core's cache), and then ``q_D`` of every row.
    """

    COLUMNS = 4096  # vocabulary slice of the normaliser

    def __init__(self, target_rows, index, target_head, draft_ids, softcap, mm_dtype) -> None:
        self.full = draft_ids is None
        self.index, self.softcap, self.head, self.mm_dtype = index, softcap, target_head, mm_dtype
        self.target_rows = target_rows
        if self.full:
            return
        rows, self.inverse = torch.unique(index, return_inverse=True)
        x = target_rows[rows].to(mm_dtype)  # [r, H]
        lse = x.new_full((x.shape[0], 1), -torch.inf, dtype=torch.float32)  # [r, 1], slice by slice
        for start in range(0, target_head.shape[0], self.COLUMNS):
            zt = _softcap((x @ target_head[start : start + self.COLUMNS].T).float(), softcap)  # [r, ≤4096]
            lse = torch.logaddexp(lse, _logsumexp(zt))
        head_d = _frozen(target_head, "draft rows", lambda t: t.index_select(0, draft_ids))  # [N, H]
        q = _softcap((x @ head_d.T).float(), softcap).sub_(lse).clamp_min_(EXP_FLOOR).exp_()  # [r, N]
        self.q, self.mass = q, q.sum(-1)

    def at(self, sl: slice) -> tuple[Tensor, Tensor | None]:
        if not self.full:
            inverse = self.inverse[sl]
            return self.q[inverse], self.mass[inverse]
        rows, inverse = torch.unique(self.index[sl], return_inverse=True)
        zt = (self.target_rows[rows].to(self.mm_dtype) @ self.head.T).float()  # [r, V]
        return _softmax(_softcap(zt, self.softcap))[inverse], None


def _logsumexp(z: Tensor) -> Tensor:
    """``log Σ exp z`` over the last dimension (keepdim), with :data:`EXP_FLOOR`; ``z`` is overwritten."""
    m = z.amax(dim=-1, keepdim=True)
    return z.sub_(m).clamp_min_(EXP_FLOOR).exp_().sum(dim=-1, keepdim=True).log_().add_(m)


def draft_labels(labels: Tensor, draft_ids: Tensor, vocab_size: int) -> tuple[Tensor, Tensor]:
    """Target-id labels ``[...]`` as draft ids (0 where outside the draft vocabulary) and the
    mask of those inside it."""
    mapped = target_to_draft(draft_ids, vocab_size)[labels]  # [...], -1 outside
    return mapped.clamp_min(0), mapped >= 0


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
    reduced = (None, None, None)
    if factors.draft_ids is not None:
        ids = factors.draft_ids
        labels, in_vocab = draft_labels(labels, ids, factors.target_head.shape[0])
        reduced = (factors.target_head, ids, in_vocab.reshape(-1).float())
    vocab = factors.head.shape[0] if factors.target_head is None else factors.target_head.shape[0]
    # Inside the trainer's bf16 autocast the products run in bf16 and the rest in fp32;
    # otherwise fp32 throughout.
    device = factors.hidden.device.type
    mm_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
    with torch.autocast(device, enabled=False):
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
            chunk_slots(vocab, budget_bytes),
            reduced,
            mm_dtype,
        )
    return SlotTerms(
        objective=objective,
        l1=l1.view(shape),
        ce=ce_t.view(shape) if ce_t is not None else None,
        soft_ce=soft_t.view(shape) if soft_t is not None else None,
    )
