"""Streaming text: token chunks in, text deltas out, and the deltas join to the final text.

A streamed answer must read exactly like the non-streamed one (DESIGN §10), which the
engine cuts at EOS, ``max_tokens`` or the start of the first stop string. Two things
keep a delta from being premature:

- a token can end inside a multi-byte UTF-8 character, which decodes to U+FFFD until
  the next token completes it: trailing replacement characters are held back;
- the text may end with the beginning of a stop string that the next tokens complete:
  the last ``len(longest stop) - 1`` characters are held back, and nothing at or after
  a stop string that has appeared is ever sent.

At the end, the engine's final text (:attr:`GenerationResult.text`) is authoritative:
:meth:`TextStream.finish` returns the part of it not yet sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

logger = logging.getLogger(__name__)


class TextStream:
    """Incremental detokenization of one request."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()) -> None:
        self.decode = decode
        self.stop = tuple(stop)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.tokens: list[int] = []
        self.sent = ""  # the text sent so far

    def push(self, tokens: list[int]) -> str:
        """Add a chunk of tokens; returns the text that can be sent now (maybe empty)."""
        self.tokens += tokens
        text = self.decode(self.tokens)
        end = len(text.rstrip("\ufffd"))
        if self.stop:
            hits = [i for s in self.stop if (i := text.find(s)) >= 0]
            end = min(hits) if hits else end - self._hold
        return self._send(text, end)

    def finish(self, final_text: str) -> str:
        """The rest of the engine's final text."""
        if not final_text.startswith(self.sent):
            # Decoding is prefix-stable for byte-level BPE; a tokenizer that rewrites earlier
            # text (space clean-up) could break it. Never resend: the client keeps what it has.
            logger.warning("streamed text is not a prefix of the final text; the stream may differ")
            return final_text[len(self.sent) :]
        return self._send(final_text, len(final_text))

    def _send(self, text: str, end: int) -> str:
        if end <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta = text[len(self.sent) : end]
        self.sent += delta
        return delta
