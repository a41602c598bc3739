"""Where a round's emitted tokens must be cut: EOS, ``max_tokens``, stop strings (DESIGN §3).

A verification round can emit several tokens at once; the cut must land exactly where
plain decoding would have stopped, even inside an accepted block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Cut:
    tokens: list[int]  # the emitted tokens that are kept
    finish_reason: str | None  # None: keep going; "stop" (EOS or stop string); "length"
    text: str | None = None  # the final text when a stop string ended the sequence


def _first_stop(text: str, stop: Sequence[str], search_from: int) -> int | None:
    hits = [i for s in stop if (i := text.find(s, search_from)) >= 0]
    return min(hits) if hits else None


def cut_round(
    generated: list[int],
    emitted: list[int],
    eos_ids: Sequence[int],
    max_new: int,
    stop: Sequence[str] = (),
    decode: Callable[[list[int]], str] | None = None,
) -> Cut:
    """Cut ``emitted`` (this round's tokens, after ``generated``) at the first end condition.

    EOS is kept (as HF ``generate`` keeps it) and nothing after it; ``max_new`` counts
    all generated tokens; a stop string cuts the text at its start and keeps the tokens
    up to the one that completed it.
    """
    kept: list[int] = []
    reason = None
    for token in emitted:
        if len(generated) + len(kept) >= max_new:
            reason = "length"
            break
        kept.append(token)
        if token in eos_ids:
            reason = "stop"
            break
    else:
        if len(generated) + len(kept) >= max_new:
            reason = "length"
    if stop and decode is not None and kept:
        longest = max(map(len, stop))
        before = decode(generated)
        search_from = max(0, len(before) - longest + 1)
        for j in range(1, len(kept) + 1):  # the first token that completes a stop string
            text = decode(generated + kept[:j])
            at = _first_stop(text, stop, search_from)
            if at is not None:
                return Cut(kept[:j], "stop", text[:at])
    return Cut(kept, reason)
