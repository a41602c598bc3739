"""Lossless verification of a draft block: speculative rejection sampling (DESIGN §3).

Terms (DESIGN §2; every other module uses them in this sense):

- **accepted tokens**: the longest prefix of a request's drafts that survives the
  left-to-right test "accept ``x_k`` with probability ``min(1, p_t^k(x_k) / p_d^k(x_k))``".
- **recovered token**: at the first rejected position ``k``, the token sampled from the
  residual ``norm(max(0, p_t^k - p_d^k))`` instead of the rejected draft.
- **bonus token**: when all ``lengths[r]`` drafts are accepted, the token sampled from
  the target at the next position, ``p_t^{lengths[r]}``.

Each round of a request therefore emits its accepted drafts followed by exactly one
recovered-or-bonus token (``VerifyOutput.next_tokens``). Greedy requests (temperature 0)
take the deterministic special case: accept while the draft equals the target argmax,
then emit the target argmax.

Why this is lossless (Leviathan et al. 2023): at a position the round reaches, token
``y`` is emitted with probability ``min(p_t, p_d)(y) + (1 - α) · residual(y) = p_t(y)``,
where ``α = Σ min(p_t, p_d) = 1 - ½‖p_t - p_d‖₁`` is the acceptance probability.

Randomness: a round of request r consumes ``lengths[r] + 1`` uniforms — one per draft
for the acceptance test, one for the recovered/bonus token by inverse CDF. With a
generator per request, its output and the state its generator is left in depend only on
that request's own inputs, never on the rest of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.sampling.argmax import greedy_tokens

Generators = list[torch.Generator | None] | torch.Generator | None


@dataclass(frozen=True)
class VerifyOutput:
    """The outcome of one verification round for R requests."""

    num_accepted: torch.Tensor  # [R] long, accepted drafts, 0..lengths[r]
    next_tokens: torch.Tensor  # [R] long, the recovered token, or the bonus token if all accepted

    def emitted(self, draft_tokens: torch.Tensor, r: int) -> list[int]:
        """Tokens request ``r`` emits this round: its accepted drafts, then the next token."""
        n = int(self.num_accepted[r])
        return draft_tokens[r, :n].tolist() + [int(self.next_tokens[r])]


def acceptance_probability(p_t: torch.Tensor, p_d: torch.Tensor) -> torch.Tensor:
    """Probability ``[...]`` that a draft sampled from ``p_d [..., V]`` is accepted.

    DESIGN §3 identity: ``Σ_v min(p_t, p_d)(v) = 1 - ½‖p_t - p_d‖₁``.
    """
    return 1.0 - 0.5 * (p_t - p_d).abs().sum(dim=-1)


def residual_distribution(p_t: torch.Tensor, p_d: torch.Tensor) -> torch.Tensor:
    """The recovered-token distribution ``norm(max(0, p_t - p_d))``, ``[..., V]``.

    The residual is all zero only when ``p_t == p_d``, where a rejection cannot happen;
    those rows fall back to ``p_t`` so the result is always a distribution.
    """
    return _normalised_or(p_t, (p_t - p_d).clamp_min(0.0))


def one_hot_residual(p_t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """:func:`residual_distribution` for a one-hot ``p_d`` at ``x [..., 1]``: ``p_t`` without ``x``.

    Rows where ``p_t(x) = 1`` (nothing left; a rejection cannot happen) fall back to ``p_t``.
    """
    return _normalised_or(p_t, p_t.scatter(-1, x, 0.0))


def _normalised_or(p_t: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``residual [..., V]`` normalised, rows without mass replaced by ``p_t``."""
    mass = residual.sum(dim=-1, keepdim=True)  # [..., 1]
    return torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(mass.dtype).tiny), p_t)


def accept_test(p_t_x: torch.Tensor, p_d_x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Accept each draft with probability ``min(1, p_t(x) / p_d(x))`` given ``u ~ U[0, 1)``.

    Written as ``u · p_d(x) < p_t(x)`` (no division): a draft the target gives
    probability 0 is never accepted.
    """
    return u * p_d_x < p_t_x


def sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs [R, V]`` (need not be normalised) from ``u [R] ~ U[0, 1)``.

    The CDF is accumulated in fp64 so that large vocabularies keep their tail; a token
    with probability 0 is never returned.
    """
    V = probs.shape[-1]
    cdf = probs.double().cumsum(dim=-1)  # [R, V]
    x = (u.double() * cdf[:, -1]).unsqueeze(-1)  # [R, 1]
    # The first index with cdf > x has p > 0: cumsum leaves cdf flat over zero entries.
    idx = torch.searchsorted(cdf, x, right=True).squeeze(-1)  # [R]
    overflow = idx >= V  # u * total rounded up to total (u within 2^-53 of 1): rare
    if bool(overflow.any()):
        last_with_mass = V - 1 - (probs[overflow] > 0).flip(-1).long().argmax(dim=-1)
        idx[overflow] = last_with_mass
    return idx


def draw_uniforms(lengths: torch.Tensor, K: int, generators: Generators) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniforms ``[R, K]`` for the acceptance tests and ``[R]`` for the next token (fp64).

    One shared generator (or None: the global RNG) draws the whole batch at once; a list
    draws ``lengths[r] + 1`` values from request r's own generator (None entries use the
    global RNG), so a request's draws do not depend on the rest of the batch.
    """
    R, device = lengths.shape[0], lengths.device
    if generators is None or isinstance(generators, torch.Generator):
        g_device = generators.device if generators is not None else device
        u_accept = torch.rand(R, K, generator=generators, dtype=torch.float64, device=g_device)
        u_next = torch.rand(R, generator=generators, dtype=torch.float64, device=g_device)
        return u_accept.to(device), u_next.to(device)
    assert len(generators) == R, f"{len(generators)} generators for {R} requests"
    u = torch.zeros(R, K + 1, dtype=torch.float64)  # [R, K+1]; column K is the next token's
    for r, (n, g) in enumerate(zip(lengths.tolist(), generators)):
        draws = torch.rand(
            n + 1, generator=g, dtype=torch.float64, device=g.device if g is not None else device
        )
        u[r, :n] = draws[:n].cpu()
        u[r, K] = draws[n].cpu()
    u = u.to(device)
    return u[:, :K], u[:, K]


def verify(
    draft_tokens: torch.Tensor,
    draft_lengths: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    *,
    greedy: torch.Tensor | None = None,
    generators: Generators = None,
) -> VerifyOutput:
    """Verify a draft block against the target (DESIGN §3) for R requests at once.

    Args:
        draft_tokens: ``[R, K]`` long; ``draft_tokens[r, :draft_lengths[r]]`` are request r's
            drafts, the rest is ignored (any value).
        draft_lengths: ``[R]`` long in ``0..K``: how many drafts of each request to verify.
        draft_probs: ``[R, K, V]`` the distributions the drafts were sampled from, or None
            for deterministic drafts (n-gram lookup, a greedy drafter): each is then one-hot
            at its token, which is never materialised (``K · V`` floats a request).
        target_probs: ``[R, K+1, V]`` processed target distributions at the K draft
            positions and the bonus position; request r's bonus row is
            ``target_probs[r, draft_lengths[r]]``. Rows past it are ignored.
        greedy: ``[R]`` bool, requests with temperature 0.
        generators: one shared generator, or one per request (see :func:`draw_uniforms`).
    """
    R, K = draft_tokens.shape
    V = target_probs.shape[-1]
    device = draft_tokens.device
    assert target_probs.shape == (R, K + 1, V), f"target_probs {tuple(target_probs.shape)} != {(R, K + 1, V)}"
    assert draft_lengths.shape == (R,), f"draft_lengths {tuple(draft_lengths.shape)} != ({R},)"
    assert bool(((draft_lengths >= 0) & (draft_lengths <= K)).all()), "draft_lengths must be in 0..K"
    greedy = torch.zeros(R, dtype=torch.bool, device=device) if greedy is None else greedy
    assert greedy.shape == (R,), f"greedy {tuple(greedy.shape)} != ({R},)"
    any_greedy = bool(greedy.any())
    if draft_probs is not None:
        assert draft_probs.shape == (R, K, V), f"draft_probs {tuple(draft_probs.shape)} != {(R, K, V)}"

    # Drawn for greedy requests too, so every generator advances as it always has.
    u_accept, u_next = draw_uniforms(draft_lengths, K, generators)  # [R, K], [R]
    valid = torch.arange(K, device=device) < draft_lengths.unsqueeze(-1)  # [R, K]
    tokens = torch.where(valid, draft_tokens, 0).unsqueeze(-1)  # [R, K, 1]; padding made safe
    target_at_drafts = target_probs[:, :K]  # [R, K, V]
    if any_greedy and bool(greedy.all()):
        return verify_greedy(draft_tokens, draft_lengths, greedy_tokens(target_probs))

    # Acceptance test of every draft at once; the prefix logic below keeps the first run.
    accept = torch.zeros(R, K, dtype=torch.bool, device=device)  # [R, K]
    if K > 0:
        p_t_x = target_at_drafts.gather(-1, tokens).squeeze(-1).double()  # [R, K]
        # one-hot p_d: p_d(x) = 1, so x is accepted with probability p_t(x)
        p_d_x = torch.ones_like(p_t_x) if draft_probs is None else draft_probs.gather(-1, tokens).squeeze(-1)
        accept = accept_test(p_t_x, p_d_x.double(), u_accept)
    if any_greedy:
        matches_argmax = tokens.squeeze(-1) == greedy_tokens(target_at_drafts)  # [R, K]
        accept = torch.where(greedy.unsqueeze(-1), matches_argmax, accept)
    accept = accept & valid
    num_accepted = accept.long().cumprod(dim=-1).sum(dim=-1)  # [R]: length of the accepted prefix

    # The next token comes from the row where the round stopped: the first rejected
    # position (recovered token) or position lengths[r] (bonus token).
    rows = torch.arange(R, device=device)
    p_t_stop = target_probs[rows, num_accepted].float()  # [R, V]
    rejected = num_accepted < draft_lengths  # [R]
    dist = p_t_stop
    if K > 0:
        stop = num_accepted.clamp(max=K - 1)  # [R]
        if draft_probs is None:  # max(0, p_t - one_hot(x)) is p_t without x
            residual = one_hot_residual(p_t_stop, tokens[rows, stop])
        else:
            residual = residual_distribution(p_t_stop, draft_probs[rows, stop].float())
        dist = torch.where((rejected & ~greedy).unsqueeze(-1), residual, p_t_stop)  # [R, V]
    next_tokens = sample_inverse_cdf(dist, u_next)  # [R]
    if any_greedy:
        next_tokens = torch.where(greedy, greedy_tokens(p_t_stop), next_tokens)
    return VerifyOutput(num_accepted=num_accepted, next_tokens=next_tokens)


def verify_greedy(
    draft_tokens: torch.Tensor, draft_lengths: torch.Tensor, choice: torch.Tensor
) -> VerifyOutput:
    """:func:`verify` when every request is greedy, from the target's greedy tokens ``choice [R, K+1]``.

    ``choice`` is the argmax of the raw logits (the greedy row is one-hot there, ties to the
    lowest id as ``argmax`` breaks them), so a caller need not build V-wide rows at all. A
    draft is accepted iff it is the choice; the next token is the choice where the round
    stopped. No uniforms are drawn.
    """
    R, K = draft_tokens.shape
    valid = torch.arange(K, device=draft_tokens.device) < draft_lengths.unsqueeze(-1)  # [R, K]
    accept = (draft_tokens == choice[:, :K]) & valid  # [R, K]
    num_accepted = accept.long().cumprod(dim=-1).sum(dim=-1)  # [R]
    rows = torch.arange(R, device=draft_tokens.device)
    return VerifyOutput(num_accepted=num_accepted, next_tokens=choice[rows, num_accepted])
