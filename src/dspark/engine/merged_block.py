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
    """Rows of every part, in order, padded to K drafts; confidences kept iff some part has them.

    ``fill_confidences`` maps peaks ``[n, K]`` (:meth:`DraftBlock.peaks`) to confidences for
    the rows of a part without its own. The merged block is one-hot (``probs`` None) when
    every part is; otherwise the one-hot parts' rows are built (a sampled round mixing an
    n-gram proposal with a model draft: the only case that pays for them).
    """
    parts = [(reqs, b) for reqs, b in parts if reqs]
    if not parts:
        return DraftBlock.empty(0, vocab_size)
    if len(parts) == 1 and parts[0][1].max_len == K:
        return parts[0][1]
    dense = next((b.probs for _, b in parts if b.probs is not None and b.max_len > 0), None)
    tokens, lengths, probs, confs = [], [], [], []
    with_conf = any(b.confidences is not None for _, b in parts)
    for _, b in parts:
        n, k = b.tokens.shape
        t = torch.zeros(n, K, dtype=torch.long)
        t[:, :k] = b.tokens.cpu()
        tokens.append(t)
        lengths.append(b.lengths.cpu().clamp(max=K))
        if dense is not None:
            p = dense.new_zeros(n, K, dense.shape[-1])  # [n, K, V]
            if b.probs is not None:
                p[:, :k] = b.probs.to(p)
            else:  # one-hot at the tokens (the padding's rows too: distributions, never read)
                p.scatter_(-1, t.to(p.device).unsqueeze(-1), 1.0)
            probs.append(p)
        if with_conf:
            c = b.confidences if b.confidences is not None else fill_confidences(b.peaks())
            cc = torch.zeros(n, K)
            cc[:, :k] = c.cpu().float()[:, :K]
            confs.append(cc)
    return DraftBlock(
        tokens=torch.cat(tokens),
        lengths=torch.cat(lengths),
        probs=torch.cat(probs) if dense is not None else None,
        confidences=torch.cat(confs) if with_conf else None,
    )
