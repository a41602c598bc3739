import json
import shutil

import pytest

from dspark.data.estimate import (
    DEEPSPEC_BYTES_PER_TOKEN,
    bytes_per_token,
    check_disk,
    estimate_cache,
    format_bytes,
    model_dims,
)
from dspark.errors import DsparkError


def test_deepspec_default_is_30_7_kb_per_token():
    # Qwen3-4B: H = 2560, layers [1, 9, 17, 25, 33] + the last hidden state, bf16.
    assert bytes_per_token(2560, 5, "bf16") == DEEPSPEC_BYTES_PER_TOKEN + 4 + 1
    assert format_bytes(DEEPSPEC_BYTES_PER_TOKEN) == "30.7 KB"


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ("fp32", 6 * 4096 * 4 + 5),
        ("bf16", 6 * 4096 * 2 + 5),
        ("fp16", 6 * 4096 * 2 + 5),
        ("fp8", 6 * 4096 + 5 + 24),
    ],
)
def test_bytes_per_token_formula(dtype, expected):
    assert bytes_per_token(4096, 5, dtype) == expected
    est = estimate_cache(4096, 5, dtype, 1000)
    assert est.total_bytes == 1000 * expected
    assert f"{expected:,} B" in est.describe()


def test_bad_inputs():
    with pytest.raises(DsparkError, match="unknown cache dtype"):
        bytes_per_token(64, 2, "int4")
    with pytest.raises(DsparkError):
        bytes_per_token(0, 2, "bf16")


def test_model_dims_reads_config_and_nested_text_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 2560, "num_hidden_layers": 36}))
    assert model_dims(tmp_path) == (2560, 36)
    (tmp_path / "config.json").write_text(
        json.dumps({"text_config": {"hidden_size": 8, "num_hidden_layers": 2}})
    )
    assert model_dims(tmp_path) == (8, 2)
    with pytest.raises(DsparkError, match="no config.json"):
        model_dims(tmp_path / "nope")


def test_check_disk_refuses_what_does_not_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**12, 0, 10**6))
    check_disk(tmp_path / "not" / "yet", 900_000)
    with pytest.raises(DsparkError, match=r"needs 999.0 KB but .* has 1.0 MB free"):
        check_disk(tmp_path, 999_000)
