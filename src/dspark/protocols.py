"""The small contracts that the parts of dspark meet at (DESIGN §5).

Dimension letters (DESIGN §2): R requests, K draft positions, V vocab, T sequence,
H hidden, L target feature layers.

A *drafter* proposes up to ``max_len`` tokens for each request from that request's
:class:`SequenceState` and is told afterwards what the target accepted. The decoding
loop owns the states; a drafter may keep whatever it needs between rounds in
``state.drafter_cache`` (its KV cache, its n-gram index, ...), and nothing else does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from dspark.errors import InvalidSamplingError


@dataclass
class SequenceState:
    """Everything known about one request between two rounds.

    ``token_ids`` holds the prompt and every emitted token; its last element is the
    anchor (DESIGN §2) of the next round. ``features`` holds the target's fused-layer
    features for every token except the anchor (the anchor was just sampled and has
    not been through the target yet).
    """

    request_id: int
    token_ids: list[int]
    prompt_len: int
    features: torch.Tensor | None = None  # [T-1, L, H] raw outputs of target_layer_ids
    drafter_cache: Any = None
    lookup_index: Any = None  # prompt lookup's index of token positions (drafters/ngram.py)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.prompt_len


@dataclass(frozen=True)
class DraftBlock:
    """A round's proposals for R requests.

    ``tokens[r, :lengths[r]]`` are request r's drafts; the rest is padding (0).
    ``probs[r, k]`` is the full draft distribution the token at k was sampled from
    (after the same temperature/top-k/top-p processing as the target, DESIGN §3).
    ``probs`` is None when every draft is one-hot at its token (a deterministic proposer
    such as n-gram lookup, or a drafter whose requests are all greedy): verification and the
    confidence estimator need only the tokens then, and ``R·K·V`` floats a round (25 MB at
    16 requests on a 49k vocabulary) are never built. ``confidences[r, k]`` is the
    predicted conditional acceptance c_k (DSpark only).
    """

    tokens: torch.Tensor  # [R, K] long
    lengths: torch.Tensor  # [R] long, 0 <= lengths[r] <= K
    probs: torch.Tensor | None  # [R, K, V] float, rows sum to 1; None: one-hot at tokens
    confidences: torch.Tensor | None = None  # [R, K]

    def __post_init__(self) -> None:
        R, K = self.tokens.shape
        assert self.lengths.shape == (R,), f"lengths {tuple(self.lengths.shape)} != ({R},)"
        if self.probs is not None:
            assert self.probs.shape[:2] == (R, K), f"probs {tuple(self.probs.shape)} vs tokens {(R, K)}"
        if self.confidences is not None:
            assert self.confidences.shape == (R, K)

    @property
    def max_len(self) -> int:
        return self.tokens.shape[1]

    def peaks(self) -> torch.Tensor:
        """``max_v p_d^k(v)`` ``[R, K]`` fp32: the confidence estimator's feature (1 when one-hot)."""
        if self.probs is None:
            return torch.ones(self.tokens.shape, device=self.tokens.device)
        return self.probs.amax(dim=-1).float()

    def invalid_rows(self) -> torch.Tensor:
        """``[R]`` bool: requests whose proposed positions are not distributions (NaN/inf, no
        mass) or have non-finite confidences — a corrupt drafter; sampling from them is undefined."""
        valid = torch.arange(self.max_len) < self.lengths.cpu().unsqueeze(-1)  # [R, K]
        if self.probs is None:
            ok = torch.ones(valid.shape, dtype=torch.bool)
        else:
            mass = self.probs.sum(dim=-1).cpu()  # [R, K]; non-finite iff some entry is
            ok = torch.isfinite(mass) & (mass > 0)
        if self.confidences is not None:
            ok &= torch.isfinite(self.confidences.cpu())
        return (valid & ~ok).any(dim=-1)

    @staticmethod
    def empty(num_requests: int, vocab_size: int) -> DraftBlock:
        return DraftBlock(
            tokens=torch.zeros(num_requests, 0, dtype=torch.long),
            lengths=torch.zeros(num_requests, dtype=torch.long),
            probs=torch.zeros(num_requests, 0, vocab_size),
        )


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Per-request sampling parameters (DESIGN §10). ``temperature == 0`` means greedy."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise InvalidSamplingError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidSamplingError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidSamplingError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise InvalidSamplingError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def acceptance_length(accepted: float, rounds: float) -> float:
    """τ (DESIGN §2), the one definition: tokens emitted per round, bonus included, i.e.
    ``(accepted drafts + rounds) / rounds`` — each round emits its accepted drafts plus one
    recovered or bonus token; 0.0 for no rounds."""
    return (accepted + rounds) / rounds if rounds else 0.0


@dataclass(frozen=True)
class DrafterTraits:
    """What a drafter tells the engine about itself, in one place (DESIGN §9, §10).

    - ``deterministic``: its proposal is a function of the tokens alone (prompt lookup), so
      the engine computes it before planning a round (it bounds what the drafter can offer)
      and later compares it with what the request emitted, a free observation of its
      acceptance (``scheduler/controller.py``).
    - ``after_prompt``: worth asking in a request's first round, whose anchor is the prompt's
      last token. Not a drafter trained only on response anchors (DESIGN §6: positions ``i``
      and ``i + 1`` both supervised): it never learned an answer's first token, and its drafts
      there are rejected (0 of 7 on every prompt, for the tiny target's DFlash, DSpark and
      Eagle3). That round decodes plainly instead.
    - ``lazy``: it absorbs the committed tokens' features when it next proposes
      (:class:`LazyDrafter`), so the rounds it does not draft cost it nothing.
    - ``chain``: one forward per draft with one row per request (Eagle3), instead of one
      forward over the anchor and the block's ``K`` slots (DFlash, DSpark): the rows a request
      adds to a drafter call, which splits a call's seconds into its shared and per-request parts.
    """

    deterministic: bool = False
    after_prompt: bool = True
    lazy: bool = False
    chain: bool = False

    def rows_per_request(self, block_size: int) -> int:
        return 1 if self.chain else block_size + 1


@runtime_checkable
class Drafter(Protocol):
    """What the decoding loop needs from a drafter (DESIGN §5).

    ``target_layer_ids`` names the target layers whose raw outputs the drafter reads
    (empty for drafters that need no features, like n-gram lookup); every target forward
    of a decode is passed them. ``block_size`` is the most drafts one ``propose`` makes
    (γ), the default verification length of a round. ``traits`` (:class:`DrafterTraits`)
    says how the engine should treat it; a drafter that declares none gets the defaults
    (:func:`drafter_traits`).
    """

    target_layer_ids: tuple[int, ...]
    block_size: int

    def propose(
        self, states: list[SequenceState], max_len: int, sampling: list[SamplingParams]
    ) -> DraftBlock:
        """Draft up to ``max_len`` tokens after each state's anchor."""
        ...

    def update(self, state: SequenceState, num_accepted: int, new_features: torch.Tensor | None) -> None:
        """Absorb a verified round: ``state`` already holds the new tokens."""
        ...


@runtime_checkable
class LazyDrafter(Drafter, Protocol):
    """A drafter with ``traits.lazy``: told only about the rounds it drafted, it absorbs the
    features of every token committed since when it next proposes."""

    def pending(self, state: SequenceState) -> int:
        """Committed tokens whose features it has not absorbed yet."""
        ...

    def catch_up(self, states: list[SequenceState], sampling: list[SamplingParams]) -> None:
        """Absorb them now (also creates a request's cache on its first proposal)."""
        ...


def drafter_traits(drafter: Drafter) -> DrafterTraits:
    """``drafter.traits``, or the defaults for a drafter that declares none."""
    traits = getattr(drafter, "traits", None)
    return traits if isinstance(traits, DrafterTraits) else DrafterTraits()


@runtime_checkable
class TrainableDrafter(Drafter, Protocol):
    """A drafter the trainer can train (DESIGN §6): built for a target from a frozen config,
    it predicts blocks from a :class:`TrainBatch`.

    ``config`` is the frozen config dataclass that :mod:`dspark.drafters.kinds` writes to
    and reads from ``config.json``; its ``objective`` (a
    ``dspark.drafters.objective_config.ObjectiveConfig``) says what the trainer minimises, and
    the trainer computes it on the output of ``forward_train`` (``dspark.training.objective``).
    """

    config: Any

    @classmethod
    def from_target(cls, target: Any, config: Any) -> TrainableDrafter:
        """A fresh drafter for ``target``: shared embedding and LM head copied and frozen."""
        ...

    def forward_train(self, batch: TrainBatch) -> TrainOutput:
        """Block predictions ``[B, A, K, V]`` for the anchors of ``batch``."""
        ...


@dataclass
class RoundLog:
    """One speculative round of one request, as the metrics of DESIGN §2 count it."""

    proposed: int  # drafts proposed (verified) this round
    accepted: int  # drafts accepted
    emitted: int  # tokens emitted = accepted + 1, fewer if EOS/max_tokens cut the round


@dataclass
class GenerationResult:
    """The outcome of one request."""

    token_ids: list[int]  # generated tokens only
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled" | "error" (the engine failed this request)
    rounds: list[RoundLog] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None  # with finish_reason "error": what went wrong

    @property
    def tau(self) -> float:
        """Acceptance length τ: tokens emitted per round, bonus included (DESIGN §2)."""
        return acceptance_length(sum(r.accepted for r in self.rounds), len(self.rounds))

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class TrainBatch:
    """One training batch with the frozen target's outputs already computed (DESIGN §6).

    ``features`` are the raw outputs of the drafter's ``target_layer_ids``;
    ``target_hidden`` is the target's final-normed last hidden state, from which the
    target distribution at any position is ``lm_head(target_hidden)`` (V-sized logits
    are never cached, DESIGN §7). ``loss_mask`` marks response (assistant) tokens.
    """

    input_ids: torch.Tensor  # [B, T] long
    loss_mask: torch.Tensor  # [B, T] bool
    features: torch.Tensor  # [B, T, L, H]
    target_hidden: torch.Tensor  # [B, T, H]
    anchors: torch.Tensor | None = None  # [B, A] long anchor positions, -1 = padding (DESIGN §6)


@dataclass(frozen=True)
class SlotFactors:
    """The draft and target logits of every slot as the factors they are made of (DESIGN §6).

    ``draft[s] = softcap(hidden[s] · headᵀ + low_rank_u[s] · low_rank_wᵀ)`` and
    ``target[s] = softcap(target_rows[target_index[s]] · headᵀ)``. A loss can then work
    through the slots in chunks and never hold ``[B, A, K, V]`` tensors
    (:mod:`dspark.training.chunked_objective`); :meth:`draft_logits` /
    :meth:`target_logits` materialize them for the dense reference path.
    """

    hidden: torch.Tensor  # [B, A, K, H] final-normed draft hidden states
    head: torch.Tensor  # [V, H] the frozen LM head shared with the target
    target_rows: torch.Tensor  # [U, H] the target's final-normed hidden at the distinct slot positions
    target_index: torch.Tensor  # [B, A, K] long, the row of target_rows of each slot
    softcap: float | None = None  # the family's final logit softcapping (Gemma2)
    low_rank_u: torch.Tensor | None = None  # [B, A, K, r] the sequential head's factor (DSpark)
    low_rank_w: torch.Tensor | None = None  # [V, r] W_2ᵀ ([N, r] with a reduced draft vocabulary)
    # A reduced draft vocabulary: ``head`` is then ``[N, H]``, the target's rows of
    # ``draft_ids [N]``, and ``target_head [V, H]`` the target's full head (None: ``head``).
    draft_ids: torch.Tensor | None = None
    target_head: torch.Tensor | None = None

    def _cap(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.softcap is None else self.softcap * torch.tanh(logits / self.softcap)

    def draft_logits(self) -> torch.Tensor:
        """``[B, A, K, V]`` fp32 (``[B, A, K, N]`` over a reduced draft vocabulary)."""
        logits = self.hidden.float() @ self.head.float().T  # [B, A, K, V]
        if self.low_rank_u is not None:
            logits = logits + self.low_rank_u.float() @ self.low_rank_w.float().T
        return self._cap(logits)

    def target_logits(self) -> torch.Tensor:
        """``[B, A, K, V]`` fp32, over the target's whole vocabulary."""
        head = self.head if self.target_head is None else self.target_head
        return self._cap(self.target_rows.float() @ head.float().T)[self.target_index]


class TrainOutput:
    """Supervised predictions of a drafter for A blocks of K positions per sequence.

    ``logits[b, a, k]`` is the drafter's prediction of ``labels[b, a, k]``;
    ``target_logits`` is the target's prediction at the same position; ``valid`` marks
    the contiguous supervised prefix of each block (DESIGN §6). A drafter gives either the
    dense logits or their :class:`SlotFactors` (then ``logits`` / ``target_logits``
    materialize on first access, and the loss never needs them whole).
    """

    def __init__(
        self,
        *,
        labels: torch.Tensor,  # [B, A, K] long ground-truth tokens x_k*
        valid: torch.Tensor,  # [B, A, K] bool
        logits: torch.Tensor | None = None,  # [B, A, K, V] draft logits (Markov-corrected for DSpark)
        target_logits: torch.Tensor | None = None,  # [B, A, K, V]
        confidences: torch.Tensor | None = None,  # [B, A, K] in (0, 1), DSpark only
        factors: SlotFactors | None = None,
    ) -> None:
        if factors is None and (logits is None or target_logits is None):
            raise ValueError("a TrainOutput needs logits and target_logits, or their factors")
        self.labels, self.valid, self.confidences, self.factors = labels, valid, confidences, factors
        self._logits, self._target_logits = logits, target_logits

    @property
    def logits(self) -> torch.Tensor:
        if self._logits is None:
            self._logits = self.factors.draft_logits()
        return self._logits

    @property
    def target_logits(self) -> torch.Tensor:
        if self._target_logits is None:
            self._target_logits = self.factors.target_logits()
        return self._target_logits

    @property
    def draft_ids(self) -> torch.Tensor | None:
        """``[N]`` target ids of a reduced draft vocabulary (``logits`` are then ``[..., N]``), else None."""
        return self.factors.draft_ids if self.factors is not None else None

    @property
    def dense(self) -> bool:
        """True when the logits exist as tensors (given, or materialized by an access)."""
        return self._logits is not None and self._target_logits is not None
