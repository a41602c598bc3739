"""One block from the parts several proposers drafted (engine/speculation.py: merge_blocks).

A deterministic part (n-gram lookup) carries no probabilities: the merged block stays
without them when every part is one-hot, and builds its one-hot rows only beside a part
that has real distributions (a sampled model draft).
"""

from __future__ import annotations

import torch

from dspark.engine.speculation import merge_blocks
from dspark.protocols import DraftBlock

V, K = 11, 4


def ngram_part(tokens: list[list[int]], lengths: list[int]) -> DraftBlock:
    return DraftBlock(tokens=torch.tensor(tokens), lengths=torch.tensor(lengths), probs=None)


def calibrated(peaks: torch.Tensor) -> torch.Tensor:
    return 0.25 * peaks  # [n, K]: a recognisable stand-in for the confidence estimator


def test_one_hot_parts_stay_without_probabilities():
    a = ngram_part([[1, 2, 0]], [2])
    b = ngram_part([[3, 4, 5, 6]], [4])
    merged = merge_blocks([(["a"], a), (["b"], b)], K, V, calibrated)
    assert merged.probs is None and merged.confidences is None
    assert merged.tokens.tolist() == [[1, 2, 0, 0], [3, 4, 5, 6]]
    assert merged.lengths.tolist() == [2, 4]
    assert torch.equal(merged.peaks(), torch.ones(2, K))


def test_beside_a_model_part_the_one_hot_rows_are_built_and_confidences_filled():
    g = torch.Generator().manual_seed(0)
    model_probs = torch.softmax(torch.randn(1, K, V, generator=g), dim=-1)
    model = DraftBlock(
        tokens=model_probs.argmax(-1),
        lengths=torch.tensor([K]),
        probs=model_probs,
        confidences=torch.tensor([[0.9, 0.8, 0.7, 0.6]]),
    )
    ngram = ngram_part([[7, 8]], [2])
    merged = merge_blocks([(["m"], model), (["n"], ngram)], K, V, calibrated)
    assert merged.probs is not None and merged.probs.shape == (2, K, V)
    torch.testing.assert_close(merged.probs[0], model_probs[0])
    assert merged.probs[1, 0, 7] == 1 and merged.probs[1, 1, 8] == 1
    torch.testing.assert_close(merged.probs[1].sum(-1), torch.ones(K))  # padding rows too
    torch.testing.assert_close(merged.confidences[0], torch.tensor([0.9, 0.8, 0.7, 0.6]))
    torch.testing.assert_close(merged.confidences[1], torch.tensor([0.25, 0.25, 0.0, 0.0]))
