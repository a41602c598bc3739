"""Drafter objectives and training metrics (DESIGN §6; paper Eqs. 9-12).

Every term is a per-slot value ``[B, A, K]`` reduced by one rule: a mean over the
supervised slots (``TrainOutput.valid``) weighted by the position weight ``w_k`` of the
slot. Two weightings exist:

- exponential, ``w_k = exp(-(k-1)/δ)`` for DFlash/DSpark (δ = 4.0 in DeepSpec; the paper
  writes γ);
- geometric, ``w_k = r^(k-1)`` for Eagle3's training-time test (r = 0.8).

A drafter's objective is data (:class:`~dspark.drafters.objective_config.ObjectiveConfig`
in its config): which terms with which coefficients, so one function (:func:`compute_loss`),
called by the trainer on the drafter's ``forward_train`` output, serves every method and no
code branches on a method name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dspark.drafters.objective_config import ObjectiveConfig
from dspark.protocols import TrainOutput
from dspark.sampling.rejection import acceptance_probability
from dspark.training.chunked_objective import DEFAULT_BUDGET_BYTES, chunked_terms, draft_labels

_EPS = 1e-6  # keeps log(c) and log(1 - c) finite for confidences saturated in fp32


# -- position weights and the one reduction -------------------------------------------


def position_weights(
    K: int, *, decay: float | None = None, geometric: float | None = None, device=None
) -> Tensor:
    """``[K]`` weights of slots k = 1..K: ``exp(-(k-1)/decay)`` or ``geometric^(k-1)``."""
    assert (decay is None) != (geometric is None), "give exactly one of decay and geometric"
    k = torch.arange(K, dtype=torch.float32, device=device)  # k - 1 for k = 1..K
    if decay is not None:
        return torch.exp(-k / decay)
    return torch.full((K,), float(geometric), device=device) ** k


def weighted_mean(values: Tensor, valid: Tensor, weights: Tensor) -> Tensor:
    """``Σ w_k v · valid / Σ w_k valid`` over ``[B, A, K]``; 0 when nothing is valid."""
    assert values.shape == valid.shape, f"{tuple(values.shape)} vs {tuple(valid.shape)}"
    w = weights.to(values.device) * valid.float()  # [B, A, K]
    return (values.float() * w).sum() / w.sum().clamp_min(1e-12)


# -- per-slot terms ---------------------------------------------------------------------


def nll(logp: Tensor, labels: Tensor) -> Tensor:
    """``-log p_d(x*)`` per slot from log-probabilities ``[..., V]`` and labels ``[...]`` (Eq. 9)."""
    return -logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """``-log p_d(x*)`` per slot: logits ``[..., V]``, labels ``[...]`` → ``[...]`` (Eq. 9)."""
    return nll(torch.log_softmax(logits.float(), dim=-1), labels)


def soft_nll(logp: Tensor, p_t: Tensor) -> Tensor:
    """``-Σ_v p_t(v) log p_d(v)`` per slot from draft log-probabilities and target probabilities."""
    return -(p_t * logp).sum(dim=-1)


def soft_cross_entropy(logits: Tensor, target_logits: Tensor) -> Tensor:
    """``-Σ_v p_t(v) log p_d(v)`` per slot (Eagle3): ``[..., V]`` → ``[...]``."""
    return soft_nll(torch.log_softmax(logits.float(), dim=-1), torch.softmax(target_logits.float(), dim=-1))


def l1_distance(p_d: Tensor, p_t: Tensor) -> Tensor:
    """``‖p_d - p_t‖₁`` per slot, in [0, 2] (Eq. 10; twice the total variation)."""
    return (p_d.float() - p_t.float()).abs().sum(dim=-1)


def soft_acceptance_label(p_d: Tensor, p_t: Tensor) -> Tensor:
    """``c* = 1 - ½‖p_d - p_t‖₁``, the acceptance probability of a draft (Eq. 8), detached."""
    return acceptance_probability(p_t.float(), p_d.float()).detach()


def binary_cross_entropy(confidence: Tensor, label: Tensor) -> Tensor:
    """``-[c* log c + (1-c*) log(1-c)]`` per slot (Eq. 11), written out so autocast allows it."""
    c = confidence.float().clamp(_EPS, 1.0 - _EPS)
    return -(label * torch.log(c) + (1.0 - label) * torch.log1p(-c))


# -- results --------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftMetrics:
    """How good the drafts are, from the training batch (DESIGN §6), all detached.

    ``acceptance[k]``: mean ``1 - ½‖p_d - p_t‖₁`` of slot k over supervised slots (the
    expected conditional acceptance; NaN where no slot k was supervised).
    ``expected_tau``: ``1 + Σ_k Π_{i≤k} acceptance[i]`` over the leading positions with data.
    ``confidence_bias``: mean ``c - c*`` (positive = over-confident); None without a head.
    """

    acceptance: Tensor  # [K]
    expected_tau: float
    confidence_bias: float | None = None


@dataclass(frozen=True)
class LossOutput:
    """The objective (``loss``, with grad) and its detached terms (None = not used)."""

    loss: Tensor  # scalar
    ce: Tensor | None
    tv: Tensor | None
    conf: Tensor | None
    soft_ce: Tensor | None
    metrics: DraftMetrics


def draft_metrics(p_d: Tensor, p_t: Tensor, valid: Tensor, confidences: Tensor | None = None) -> DraftMetrics:
    """Per-position expected acceptance, expected τ and confidence bias (DESIGN §6)."""
    return acceptance_metrics(soft_acceptance_label(p_d, p_t), valid, confidences)


def acceptance_metrics(accept: Tensor, valid: Tensor, confidences: Tensor | None = None) -> DraftMetrics:
    """:class:`DraftMetrics` from the per-slot acceptance probabilities ``accept [B, A, K]``."""
    with torch.no_grad():
        v = valid.float()
        count = v.flatten(0, -2).sum(0)  # [K]
        per_pos = (accept * v).flatten(0, -2).sum(0) / count.clamp_min(1.0)  # [K]
        per_pos = torch.where(count > 0, per_pos, torch.full_like(per_pos, math.nan))
        has_data = ~per_pos.isnan()
        leading = int(has_data.long().cumprod(0).sum())  # positions before the first gap
        tau = 1.0 + float(per_pos[:leading].cumprod(0).sum()) if leading else 1.0
        bias = None
        if confidences is not None:
            bias = float(((confidences.float() - accept) * v).sum() / v.sum().clamp_min(1.0))
    return DraftMetrics(acceptance=per_pos, expected_tau=tau, confidence_bias=bias)


def compute_loss(
    out: TrainOutput, objective: ObjectiveConfig, *, budget_bytes: int = DEFAULT_BUDGET_BYTES
) -> LossOutput:
    """``L = ce·L_ce + tv·L_tv + conf·L_conf + soft_ce·L_soft_ce`` (paper Eq. 12).

    The draft distribution is ``softmax(out.logits)`` (already Markov-corrected for
    DSpark), the target distribution ``softmax(out.target_logits)``; both at
    temperature 1. An output given as :class:`~dspark.protocols.SlotFactors` goes through
    the chunked path (:mod:`dspark.training.chunked_objective`, same values and
    gradients) within ``budget_bytes`` of V-sized tensors; dense logits take this one.
    """
    if out.factors is not None and not out.dense:
        return _chunked_loss(out, objective, budget_bytes)
    B, A, K, N = out.logits.shape  # N = V unless the draft vocabulary is reduced
    V = out.target_logits.shape[-1]
    assert out.target_logits.shape[:3] == (B, A, K), f"{tuple(out.target_logits.shape)} vs {(B, A, K)}"
    assert out.labels.shape == (B, A, K) and out.valid.shape == (B, A, K)
    w = position_weights(K, decay=objective.decay, geometric=objective.geometric, device=out.logits.device)
    valid = out.valid
    # One log-softmax serves every term: p_d = exp(log p_d) (one pass over [B, A, K, V] fewer).
    logp_d = torch.log_softmax(out.logits.float(), dim=-1)  # [B, A, K, V]
    p_d = logp_d.exp()  # [B, A, K, V]
    p_t = torch.softmax(out.target_logits.float(), dim=-1).detach()  # [B, A, K, V]
    labels, in_vocab, outside = out.labels, None, None
    if out.draft_ids is not None:  # a reduced draft vocabulary (drafters/draft_vocab.py)
        labels, in_vocab = draft_labels(labels, out.draft_ids, V)
        p_t = p_t[..., out.draft_ids]  # [B, A, K, N], not renormalised
        outside = (1.0 - p_t.sum(-1)).clamp_min(0.0)  # q(V∖D), never proposable
    assert p_t.shape[-1] == N, f"draft logits over {N} tokens, target distribution over {p_t.shape[-1]}"

    loss = out.logits.new_zeros((), dtype=torch.float32)
    terms: dict[str, Tensor | None] = dict(ce=None, tv=None, conf=None, soft_ce=None)
    if objective.ce > 0:
        ce = nll(logp_d, labels)  # [B, A, K]
        terms["ce"] = weighted_mean(ce if in_vocab is None else ce * in_vocab, valid, w)
        loss = loss + objective.ce * terms["ce"]
    # ‖p_d - p_t‖₁ once per slot: the TV term (with grad), the soft label and the metrics.
    with torch.set_grad_enabled(torch.is_grad_enabled() and objective.tv > 0):
        l1 = l1_distance(p_d, p_t)  # [B, A, K]
        if outside is not None:
            l1 = l1 + outside
    accept = (1.0 - 0.5 * l1).detach()  # [B, A, K]: c* (Eq. 8)
    if objective.tv > 0:
        terms["tv"] = weighted_mean(l1, valid, w)
        loss = loss + objective.tv * terms["tv"]
    if objective.soft_ce > 0:
        q = p_t if outside is None else p_t / p_t.sum(-1, keepdim=True).clamp_min(1e-30)  # q_D / q(D)
        terms["soft_ce"] = weighted_mean(soft_nll(logp_d, q), valid, w)
        loss = loss + objective.soft_ce * terms["soft_ce"]
    if objective.conf > 0:
        if out.confidences is None:
            raise ValueError("the objective has a confidence term but the drafter gave no confidences")
        terms["conf"] = weighted_mean(binary_cross_entropy(out.confidences, accept), valid, w)
        loss = loss + objective.conf * terms["conf"]
    detached = {name: (t.detach() if t is not None else None) for name, t in terms.items()}
    return LossOutput(loss=loss, **detached, metrics=acceptance_metrics(accept, valid, out.confidences))


def _chunked_loss(out: TrainOutput, objective: ObjectiveConfig, budget_bytes: int) -> LossOutput:
    """:func:`compute_loss` on factored logits: the logit terms chunk by chunk, the rest as above."""
    K = out.labels.shape[-1]
    valid = out.valid
    w = position_weights(K, decay=objective.decay, geometric=objective.geometric, device=valid.device)
    wv = w * valid.float()  # [B, A, K]
    omega = wv / wv.sum().clamp_min(1e-12)  # the weights of weighted_mean
    t = chunked_terms(
        out.factors, out.labels, omega, ce=objective.ce, soft_ce=objective.soft_ce, tv=objective.tv,
        budget_bytes=budget_bytes,
    )  # fmt: skip
    loss = t.objective
    accept = 1.0 - 0.5 * t.l1  # [B, A, K]: c* (Eq. 8), detached
    terms: dict[str, Tensor | None] = dict(ce=None, tv=None, conf=None, soft_ce=None)
    for name, coef, values in (
        ("ce", objective.ce, t.ce),
        ("tv", objective.tv, t.l1),
        ("soft_ce", objective.soft_ce, t.soft_ce),
    ):  # noqa: E501
        if coef > 0:
            terms[name] = weighted_mean(values, valid, w).detach()
    if objective.conf > 0:
        if out.confidences is None:
            raise ValueError("the objective has a confidence term but the drafter gave no confidences")
        conf = weighted_mean(binary_cross_entropy(out.confidences, accept), valid, w)
        loss = loss + objective.conf * conf
        terms["conf"] = conf.detach()
    return LossOutput(loss=loss, **terms, metrics=acceptance_metrics(accept, valid, out.confidences))


def drafter_loss(config, out: TrainOutput) -> LossOutput:
    """The loss of a drafter whose config is ``config``, from its ``objective`` (no method-name branching)."""
    return compute_loss(out, config.objective)
