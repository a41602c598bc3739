import numpy as np
import pytest
import torch

from dspark.data.cache import ALIGN, encode_sample, quantize_fp8, sample_layout
from dspark.data.estimate import bytes_per_token


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16", "fp8"])
@pytest.mark.parametrize(("T", "L", "H"), [(1, 1, 8), (37, 5, 64), (5, 3, 7)])
def test_layout_is_aligned_and_as_small_as_the_estimate(dtype, T, L, H):
    layout = sample_layout(T, L, H, dtype)
    sections = [k for k in layout if k != "size"]
    assert all(layout[k][0] % ALIGN == 0 for k in sections)
    ends = sorted(
        (layout[k][0], layout[k][0] + layout[k][1].itemsize * int(np.prod(layout[k][2]))) for k in sections
    )
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ends, ends[1:]))  # no overlap
    payload = T * bytes_per_token(H, L, dtype)
    assert payload <= layout["size"] < payload + ALIGN * len(sections)


def test_encoded_sections_hold_the_values():
    g = torch.Generator().manual_seed(0)
    T, L, H = 6, 2, 16
    ids, mask = torch.randint(0, 50_000, (T,), generator=g), torch.rand(T, generator=g) > 0.5
    features, hidden = torch.randn(T, L, H, generator=g), torch.randn(T, H, generator=g)
    data = np.frombuffer(encode_sample(ids, mask, features, hidden, "bf16"), dtype=np.uint8)
    layout = sample_layout(T, L, H, "bf16")
    assert data.size == layout["size"]

    def section(name):
        offset, dt, shape = layout[name]
        return data[offset : offset + dt.itemsize * int(np.prod(shape))].view(dt).reshape(shape)

    assert section("ids").tolist() == ids.tolist() and section("mask").astype(bool).tolist() == mask.tolist()
    got = torch.from_numpy(section("features").copy()).view(torch.bfloat16)
    assert torch.equal(got, features.bfloat16())


def test_fp8_scales_per_vector_survive_outliers_and_zeros():
    x = torch.randn(4, 3, 32)
    x[0, 1, 5] = 3000.0  # a "massive activation", far beyond e4m3's 448
    x[2, 0] = 0.0
    q, scale = quantize_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (4, 3)
    back = q.float() * scale.unsqueeze(-1)
    amax = x.abs().amax(-1, keepdim=True)
    assert ((back - x).abs() <= amax / 16 + 1e-7).all()
    assert back[0, 1, 5] == pytest.approx(3000.0, rel=1 / 16)
    assert torch.equal(back[2, 0], torch.zeros(32)) and scale[2, 0] == 1.0
    # Vectors without the outlier keep their own (fine) resolution.
    assert (back[1] - x[1]).abs().max() < 0.07 * x[1].abs().max()
