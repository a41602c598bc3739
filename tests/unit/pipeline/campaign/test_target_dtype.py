"""The campaign's target runs in the dtype dspark serves it in on this machine (issue 16)."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.pipeline.campaign.pipeline import target_dtype
from dspark.targets import dtype as dtypes


@pytest.mark.parametrize("native", [True, False])
def test_bf16_for_large_targets_on_native_bf16_cpus_only(tmp_path, monkeypatch, native):
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name, hidden in (("smollm2", 576), ("tiny", 256)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"hidden_size": hidden}))
    assert target_dtype(tmp_path / "smollm2") == (torch.bfloat16 if native else torch.float32)
    assert target_dtype(tmp_path / "tiny") == torch.float32  # the tiny target: fp32 everywhere
