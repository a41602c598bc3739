"""The blocked greedy argmax gives torch.argmax's indices, ties and NaNs included."""

import pytest
import torch

from dspark.sampling.argmax import block_width, greedy_tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [4096, 49152, 151936, 1000, 97])
def test_the_blocked_argmax_is_torch_argmax_ties_and_nans_included(V, dtype):
    g = torch.Generator().manual_seed(V)
    x = torch.randn(2, 7, V, generator=g).to(dtype)
    x[0, 0, 5] = x[0, 0, V - 3] = 40.0  # a tie across blocks: the lower index wins
    x[0, 1, 9] = x[0, 1, 10] = 40.0  # a tie inside one block
    x[0, 2] = float("-inf")  # nothing but -inf: index 0
    x[0, 3, V // 2] = float("nan")  # a NaN is the maximum
    x[0, 4, V - 1] = x[0, 4, 3] = float("nan")  # the first NaN
    x[0, 5, V - 1] = 40.0  # the maximum in the last block
    x[1] = x[1].round()  # many ties (integer-valued rows, bf16 more so)
    got = greedy_tokens(x)
    assert got.shape == (2, 7) and got.dtype == torch.long
    assert torch.equal(got, x.argmax(dim=-1))


def test_a_strided_view_and_a_vector():
    x = torch.randn(8192, 5).t()  # [5, 8192], not contiguous
    assert torch.equal(greedy_tokens(x), x.argmax(dim=-1))
    assert torch.equal(greedy_tokens(x[2]), x[2].argmax())
    wide = torch.randn(3, 65536)  # one row above the size where blocks pay, and a vector
    assert torch.equal(greedy_tokens(wide), wide.argmax(dim=-1))
    assert torch.equal(greedy_tokens(wide[1]), wide[1].argmax())


def test_block_widths_divide_the_vocabulary_or_fall_back():
    assert block_width(49152) == 256 and block_width(151936) == 128
    assert block_width(4096) == 256 and block_width(97) is None and block_width(1000) is None
    assert all(V % block_width(V) == 0 for V in (262144, 128256, 32000, 2048))
