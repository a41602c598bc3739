"""Heads on top of a parallel draft backbone (DESIGN §5.3): sequential (Markov, RNN) and confidence."""

from dspark.heads.confidence import ConfidenceHead, scale_confidence_logits
from dspark.heads.markov import MarkovHead
from dspark.heads.rnn import RNNHead

# ``markov_head_type`` values of the DeepSpec config (DESIGN §5.4) that we build.
MARKOV_HEAD_TYPES = ("vanilla", "rnn")


def build_sequential_head(
    head_type: str, *, vocab_size: int, rank: int, hidden_size: int, draft_vocab_size: int | None = None
):
    """The sequential head named by ``markov_head_type`` (``vanilla`` = Markov, ``rnn``);
    its bias covers the draft vocabulary (``draft_vocab_size``, None = the target's)."""
    if head_type == "vanilla":
        return MarkovHead(vocab_size, rank, draft_vocab_size)
    if head_type == "rnn":
        return RNNHead(vocab_size, rank, hidden_size, draft_vocab_size)
    raise ValueError(f"unknown markov_head_type {head_type!r}; expected one of {MARKOV_HEAD_TYPES}")


__all__ = [
    "MARKOV_HEAD_TYPES",
    "ConfidenceHead",
    "MarkovHead",
    "RNNHead",
    "build_sequential_head",
    "scale_confidence_logits",
]
