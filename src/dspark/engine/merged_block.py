"""One draft block from the parts several proposers drafted in a round (issue 17).

Payoff control lets each request draft with its own proposer (n-gram lookup or the model
drafter); each proposer drafts for its requests alone, and verification wants one block.
Rows keep their part's tokens, probabilities and lengths exactly, so each row is what its
proposer would have drafted alone (lossless).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dspark.protocols import DraftBlock


def merge_blocks(
    parts: list[tuple[list, DraftBlock]],
    K: int,
    vocab_size: int,
    fill_confidences: Callable[[torch.Tensor], torch.Tensor],
) -> DraftBlock:
    """Rows of every part, in order, padded to K drafts; confidences kept iff some part has them."""
    parts = [(reqs, b) for reqs, b in parts if reqs]
    if not parts:
        return DraftBlock.empty(0, vocab_size)
    if len(parts) == 1 and parts[0][1].max_len == K:
        return parts[0][1]
    ref = next(b.probs for _, b in parts if b.probs is not None and b.max_len > 0)
    tokens, lengths, probs, confs = [], [], [], []
    with_conf = any(b.confidences is not None for _, b in parts)
    for _, b in parts:
        n, k = b.tokens.shape
        t = torch.zeros(n, K, dtype=torch.long)
        t[:, :k] = b.tokens.cpu()
        p = ref.new_zeros(n, K, ref.shape[-1])  # [n, K, V]
        if k:
            p[:, :k] = b.probs.to(p)
        tokens.append(t)
        lengths.append(b.lengths.cpu().clamp(max=K))
        probs.append(p)
        if with_conf:
            c = (
                b.confidences.cpu().float()
                if b.confidences is not None
                else fill_confidences(p).cpu().float()
            )
            cc = torch.zeros(n, K)
            cc[:, : c.shape[1]] = c[:, :K]
            confs.append(cc)
    return DraftBlock(
        tokens=torch.cat(tokens),
        lengths=torch.cat(lengths),
        probs=torch.cat(probs),
        confidences=torch.cat(confs) if with_conf else None,
    )
