"""Speculative decoding loops (batch 1 here; the batched engine lives in ``dspark.engine``)."""

from dspark.decoding.loop import speculative_generate

__all__ = ["speculative_generate"]
