"""Per-request drafting state: context K/V caches, generators, sampling and input checks (DESIGN §5).

A drafter keeps, per request, the keys/values of its context (they depend on the
target's features only, so they grow as tokens are committed and are never recomputed)
and the request's own generator, so seeded sampling is independent of batching.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dspark.drafters.common import DecoderDims
from dspark.drafters.draft_vocab import draft_to_target
from dspark.protocols import SamplingParams
from dspark.sampling.argmax import greedy_tokens
from dspark.sampling.probs import batch_probs


class ContextKV:
    """Keys/values of one request's context for every draft layer, grown in place.

    Holds ``[n_layers, 2, nkv, capacity, hd]`` and doubles the capacity when full, so
    absorbing a round's few new tokens never copies the whole context.
    """

    def __init__(self, n_layers: int, num_kv_heads: int, head_dim: int, *, dtype, device) -> None:
        self.buf = torch.zeros(n_layers, 2, num_kv_heads, 64, head_dim, dtype=dtype, device=device)
        self.length = 0

    def append(self, kv: Tensor) -> None:
        """Append ``kv [n_layers, 2, nkv, n, hd]`` for n new context entries."""
        n = kv.shape[3]
        need = self.length + n
        if need > self.buf.shape[3]:
            capacity = max(need, 2 * self.buf.shape[3])
            grown = self.buf.new_zeros(*self.buf.shape[:3], capacity, self.buf.shape[4])
            grown[..., : self.length, :] = self.buf[..., : self.length, :]
            self.buf = grown
        self.buf[..., self.length : need, :] = kv
        self.length = need

    def view(self) -> Tensor:
        """``[n_layers, 2, nkv, C, hd]`` for the C entries held."""
        return self.buf[..., : self.length, :]


@dataclass
class DrafterCache:
    """What a feature-conditioned drafter keeps per request in ``state.drafter_cache``."""

    context: ContextKV  # keys/values of the committed context, never of drafts
    generator: torch.Generator | None  # seeded from SamplingParams.seed, else None


def request_cache(
    state, params: SamplingParams, num_layers: int, dims: DecoderDims, like: Tensor
) -> DrafterCache:
    """``state.drafter_cache``, created on a request's first proposal: empty context K/V for
    ``num_layers`` draft layers (dtype and device of ``like``) and the request's generator."""
    if state.drafter_cache is None:
        context = ContextKV(
            num_layers, dims.num_kv_heads, dims.head_dim, dtype=like.dtype, device=like.device
        )
        state.drafter_cache = DrafterCache(context=context, generator=request_generator(params, like.device))
    return state.drafter_cache


def pending_tokens(state) -> int:
    """Committed tokens whose features the request's context cache lacks (all before its first proposal)."""
    cache = state.drafter_cache
    return max(len(state.token_ids) - 1 - (cache.context.length if cache is not None else 0), 0)


def sync_requests(net, states, sampling) -> list[torch.Generator | None]:
    """Create each request's missing cache (:func:`request_cache`) and let ``net.sync_context``
    absorb its newly committed features; returns the per-request generators.

    ``net`` is a feature-conditioned drafter network: ``layers`` (one context K/V per layer),
    ``dims``, ``fc`` (whose weight gives the cache's dtype and device), ``sync_context(state)``.
    """
    for state, params in zip(states, sampling):
        request_cache(state, params, len(net.layers), net.dims, like=net.fc.weight)
        net.sync_context(state)
    return [s.drafter_cache.generator for s in states]


def batch_context(caches: list[ContextKV]) -> tuple[Tensor, Tensor]:
    """R requests' context K/V right-padded, ``[n_layers, 2, R, nkv, Cmax, hd]``, and lengths ``[R]``."""
    views = [c.view() for c in caches]
    if len(views) == 1:
        return views[0].unsqueeze(2), torch.tensor([caches[0].length], device=views[0].device)
    n_layers, _, nkv, _, hd = views[0].shape
    c_max = max(c.length for c in caches)
    out = views[0].new_zeros(n_layers, 2, len(views), nkv, c_max, hd)
    for r, v in enumerate(views):
        out[:, :, r, :, : v.shape[3]] = v
    return out, torch.tensor([c.length for c in caches], device=out.device)


def padded_context_mask(lengths: Tensor, c_max: int, num_queries: int, num_own: int) -> Tensor | None:
    """``[R, 1, Tq, Cmax + own]`` bool: real context entries and all own keys; None if no padding."""
    if bool((lengths == c_max).all()):
        return None
    R = lengths.shape[0]
    ctx = torch.arange(c_max, device=lengths.device) < lengths.unsqueeze(-1)  # [R, Cmax]
    own = torch.ones(R, num_own, dtype=torch.bool, device=lengths.device)  # [R, own]
    return torch.cat([ctx, own], dim=-1)[:, None, None, :].expand(R, 1, num_queries, c_max + num_own)


def request_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """The drafter's own generator for one request: seeded from ``params.seed``, else None (global RNG)."""
    if params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(params.seed)


def sample_tokens(
    probs: Tensor, sampling: list[SamplingParams], generators: list[torch.Generator | None]
) -> Tensor:
    """One token per row of ``probs [R, V]`` or ``[R, K, V]``: argmax if greedy, else a draw.

    Request r draws from its own generator, so its drafts depend on its own seed only. A
    row that is not a distribution (NaN/inf, no mass: a corrupt drafter) is not drawn
    from; it keeps its argmax and the caller (the engine) fails that request on its probs.
    """
    if probs.dim() == 2:
        return sample_tokens(probs.unsqueeze(1), sampling, generators).squeeze(1)
    R, K, _ = probs.shape
    tokens = greedy_tokens(probs)  # [R, K]
    for r, (params, g) in enumerate(zip(sampling, generators)):
        if not params.greedy and K > 0:
            p = probs[r].float()  # [K, V]
            mass = p.sum(dim=-1)  # [K]; non-finite iff some entry is
            if bool((torch.isfinite(mass) & (mass > 0)).all()):
                tokens[r] = torch.multinomial(p, 1, generator=g).squeeze(-1)  # [K]
    return tokens


def draw_drafts(
    logits: Tensor,
    sampling: list[SamplingParams],
    generators: list[torch.Generator | None],
    draft_ids: Tensor | None,
    vocab_size: int,
) -> tuple[Tensor, Tensor | None]:
    """Drafts from logits ``[R, K, N]`` (or ``[R, N]``) over the draft vocabulary, in target ids.

    Returns the tokens and the distributions ``[R, K, V]`` they were drawn from, with
    ``p_d = 0`` outside a reduced draft vocabulary (lossless: DESIGN §3, drafters/draft_vocab.py),
    or None when every request is greedy: each draft is then one-hot at the logits' argmax,
    and nothing V-wide is built (:class:`~dspark.protocols.DraftBlock`).
    """
    if all(p.greedy for p in sampling):
        tokens = greedy_tokens(logits)  # ties: the lowest id, as sampling/probs.py breaks them
        return (tokens if draft_ids is None else draft_ids[tokens]), None
    squeeze = logits.dim() == 2
    probs = batch_probs(logits.unsqueeze(1) if squeeze else logits, sampling)  # [R, K, N]
    tokens = sample_tokens(probs, sampling, generators)  # [R, K] draft ids
    if squeeze:
        tokens, probs = tokens.squeeze(1), probs.squeeze(1)
    return draft_to_target(tokens, probs, draft_ids, vocab_size)


def assert_states(states, max_len: int, sampling) -> None:
    """Checks at the propose boundary, shared by every drafter."""
    assert len(sampling) == len(states), f"{len(sampling)} sampling params for {len(states)} states"
    assert max_len >= 0, f"max_len must be >= 0, got {max_len}"
    for s in states:
        n_feat = 0 if s.features is None else s.features.shape[0]
        if n_feat < len(s.token_ids) - 1:
            raise ValueError(
                f"request {s.request_id}: {n_feat} feature rows for {len(s.token_ids)} tokens "
                "(need one per token except the anchor)"
            )
