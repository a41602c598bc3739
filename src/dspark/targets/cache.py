"""The target's KV cache, with rollback to an accepted length (DESIGN §4).

A speculative round appends the anchor and γ drafts to the cache in one verification
forward, then keeps only the accepted prefix: ``truncate`` drops the rejected tail
without recomputing anything before it.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class TargetCache:
    """KV cache of one target over B sequences that share one length (B = 1 today).

    Wraps an HF ``DynamicCache`` built *without* the model config, so every layer is a
    plain ``DynamicLayer`` that keeps all past keys/values. With the config, HF gives
    sliding-window layers (Gemma) a ``DynamicSlidingWindowLayer`` that discards keys
    older than the window and cannot be cropped back past it; keeping them costs memory
    on those layers but makes rollback exact for every family. The attention masks still
    enforce the window, from absolute positions.

    The batched engine will grow this into per-row lengths (``[B]``) with padding and an
    attention mask; ``length`` is then the longest row.
    """

    def __init__(self) -> None:
        self.kv = DynamicCache()
        self._length = 0
        self.batch_size: int | None = None  # fixed by the first forward

    @property
    def length(self) -> int:
        """Number of tokens cached per sequence; the next token gets this position."""
        return self._length

    def advance(self, batch_size: int, num_tokens: int) -> None:
        """Record that a forward appended ``num_tokens`` per sequence (called by the adapter)."""
        if self.batch_size is None:
            self.batch_size = batch_size
        assert batch_size == self.batch_size, f"cache holds B={self.batch_size}, got B={batch_size}"
        self._length += num_tokens
        assert self.kv.get_seq_length() == self._length, (self.kv.get_seq_length(), self._length)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens of every sequence, drop the rest."""
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot roll back to {length}: cache holds {self._length} tokens")
        if length == self._length:
            return
        # HF's crop takes minus the number of tokens to remove (a positive value is the
        # legacy absolute-length form, which transformers 5.x rejects).
        self.kv.crop(length - self._length)
        self._length = length
        assert self.kv.get_seq_length() == length

    def keep_rows(self, start: int, rows: list[int]) -> None:
        """Keep the first ``start`` tokens, then the cached tokens ``start + rows[i]`` in order.

        After a token tree's verification forward the accepted path (anchor and accepted
        nodes) lies scattered among the tree's rows; this packs it behind the context and
        drops every other node. Its keys already carry the right positions (context length
        + depth), so nothing is recomputed.
        """
        if not 0 <= start <= self._length or any(not 0 <= start + i < self._length for i in rows):
            raise ValueError(f"cannot keep rows {rows} after {start}: cache holds {self._length} tokens")
        moved = [(start + j, start + i) for j, i in enumerate(rows) if i != j]  # (to, from)
        if moved:  # only the rows out of place are copied, never the context
            to = torch.tensor([t for t, _ in moved])
            src = torch.tensor([f for _, f in moved])
            for layer in self.kv.layers:
                layer.keys[..., to.to(layer.keys.device), :] = layer.keys[..., src.to(layer.keys.device), :]
                layer.values[..., to.to(layer.values.device), :] = layer.values[
                    ..., src.to(layer.values.device), :
                ]
        self.truncate(start + len(rows))

    def __repr__(self) -> str:
        return f"TargetCache(length={self._length}, batch_size={self.batch_size})"
