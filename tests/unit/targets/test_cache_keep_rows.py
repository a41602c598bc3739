"""``TargetCache.keep_rows``: a token tree's accepted path packed behind the context."""

from __future__ import annotations

import pytest
import torch

from dspark.targets import TargetAdapter


def test_keep_rows_packs_the_chosen_rows_behind_the_context(tiny_qwen3):
    target = TargetAdapter(tiny_qwen3)
    cache = target.new_cache()
    target.forward(torch.tensor([[5, 6, 7]]), cache, with_features=False)
    target.forward(torch.tensor([[8, 9, 10, 11, 12]]), cache, with_features=False)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.kv.layers]
    cache.keep_rows(3, [0, 2, 4])
    assert cache.length == 6
    for (k, v), layer in zip(before, cache.kv.layers):
        index = torch.tensor([0, 1, 2, 3, 5, 7])
        assert torch.equal(layer.keys, k[..., index, :]) and torch.equal(layer.values, v[..., index, :])
    with pytest.raises(ValueError, match="cannot keep rows"):
        cache.keep_rows(3, [3])
