"""A request's life inside the engine: queued → prefill → decode → finished (DESIGN §10).

Everything the engine keeps per request lives in :class:`Request`; the public face of a
request is its id, the :class:`TokenEvent` stream and the final
:class:`~dspark.protocols.GenerationResult`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from dspark.errors import DsparkError
from dspark.protocols import GenerationResult, RoundLog, SamplingParams, SequenceState

OnTokens = Callable[[list[int]], None]


class RequestFailedError(DsparkError):
    """One request failed inside the engine (e.g. its drafts were not finite); the engine serves on."""


@dataclass(frozen=True)
class TokenEvent:
    """Tokens a request emitted in one engine step; ``finish_reason`` is set on its last event."""

    request_id: int
    tokens: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"


class FeatureBuffer:
    """Target features of a request's committed tokens, grown in place (doubling).

    ``state.features`` is a view of the filled part, so appending a round's few rows
    never copies the whole history (a ``torch.cat`` per round would, per request).

    A round the drafter is not told about (a lazy drafter that did not draft it,
    ``DrafterTraits.lazy``) only defers its rows (:meth:`defer`): a reference to the step's feature
    tensor, copied in by :meth:`rows` when the drafter next reads ``state.features``, or
    once :data:`DEFER_LIMIT` rounds are pending (which bounds the step tensors kept
    alive). No per-request tensor work in a plain round; the same rows in the end.
    """

    def __init__(self) -> None:
        self.buf: Tensor | None = None
        self.length = 0
        self.pending: list[tuple[Tensor, int, int]] = []  # (step features [N, L, H], start, stop)

    def append(self, rows: Tensor) -> Tensor:
        """Append ``rows [n, L, H]`` after any deferred ones; returns the filled view ``[length, L, H]``."""
        if self.pending:
            self._flush()
        self._write(rows)
        return self.buf[: self.length]

    def defer(self, features: Tensor, start: int, stop: int) -> None:
        """Append ``features[start:stop]`` later (see the class docstring)."""
        self.pending.append((features, start, stop))
        if len(self.pending) >= DEFER_LIMIT:
            self._flush()

    def rows(self) -> Tensor | None:
        """Every committed row ``[length, L, H]``, deferred ones copied in (None before any)."""
        if self.pending:
            self._flush()
        return None if self.buf is None else self.buf[: self.length]

    def _flush(self) -> None:
        parts = [f[a:b] for f, a, b in self.pending]
        self.pending = []
        self._write(parts[0] if len(parts) == 1 else torch.cat(parts))

    def _write(self, rows: Tensor) -> None:
        n = rows.shape[0]
        if self.buf is None:
            self.buf = rows.new_empty(max(64, 2 * n), *rows.shape[1:])
        elif self.length + n > self.buf.shape[0]:
            grown = self.buf.new_empty(max(self.length + n, 2 * self.buf.shape[0]), *self.buf.shape[1:])
            grown[: self.length] = self.buf[: self.length]
            self.buf = grown
        self.buf[self.length : self.length + n] = rows
        self.length += n


DEFER_LIMIT = 16  # deferred rounds per request before they are copied in anyway


@dataclass(eq=False)
class Request:
    """Engine-private state of one request."""

    id: int
    params: SamplingParams
    state: SequenceState  # token_ids = prompt + generated; its last token is the next anchor
    max_new: int  # max_tokens, clamped to what the KV slot holds
    generator: torch.Generator | None  # the verification RNG, seeded from params.seed
    on_tokens: OnTokens | None
    features: FeatureBuffer = field(default_factory=FeatureBuffer)
    generated: list[int] = field(default_factory=list)
    rounds: list[RoundLog] = field(default_factory=list)
    # (step index, confidences [K]) of the last few drafting rounds, for prefix-async
    confidence_history: deque = field(default_factory=lambda: deque(maxlen=4))
    # the speculation controller (engine/speculation.py): this round's proposer, and a pending
    # shadow of a deterministic one (proposer, generated count when made, tokens)
    proposer: str | None = None
    shadow: tuple[str, int, list[int]] | None = None
    finish_reason: str | None = None
    text: str | None = None
    error: str | None = None  # why the engine failed it (finish_reason "error")
    submitted_at: float = field(default_factory=time.perf_counter)
    finished_at: float | None = None

    @property
    def prompt_len(self) -> int:
        return self.state.prompt_len

    def sync_features(self) -> None:
        """Point ``state.features`` at every committed row (before a drafter reads it): deferred
        rounds, and rows a full deferral queue already copied in (possibly into a grown buffer).

        A one-token prompt has no prefill rows, so its first rows may all be deferred ones:
        ``rows`` copies those in even while the buffer is still unallocated.
        """
        rows = self.features.rows()
        if rows is not None:
            self.state.features = rows

    @property
    def draft_budget(self) -> int:
        """Most drafts worth verifying: a round emits at most drafts + 1 tokens."""
        return self.max_new - len(self.generated) - 1

    def result(self) -> GenerationResult:
        assert self.finish_reason is not None, f"request {self.id} is not finished"
        return GenerationResult(
            token_ids=list(self.generated),
            text=self.text or "",
            finish_reason=self.finish_reason,
            rounds=list(self.rounds),
            error=self.error,
            seconds=(self.finished_at or time.perf_counter()) - self.submitted_at,
        )


# How the engine ends a request: (request, finish reason, text or None to decode it).
Finish = Callable[[Request, str, str | None], None]
