"""``--drafter dspark`` picks the shipped drafter of the loaded target (issue 16 item 5)."""

from __future__ import annotations

import pytest
import torch

from dspark.drafters import shipped
from dspark.drafters.folder import save_drafter
from dspark.drafters.registry import TRAINABLE, build_drafter
from dspark.errors import DsparkError
from dspark.targets import TargetAdapter

from .builders import build


def test_the_embedded_target_gets_its_own_shipped_drafters():
    from dspark.presets.tiny import resolve_target

    tiny = TargetAdapter.from_pretrained(resolve_target("tiny"))
    for method in TRAINABLE:
        folder = shipped.shipped_drafter_dir(method, tiny)
        assert folder == shipped.shipped_root() / "tiny" / method
        assert build_drafter(method, tiny) is not None
    assert shipped.shipped_drafter_dir("dspark") == shipped.shipped_root() / "tiny" / "dspark"


def test_a_target_without_shipped_drafters_gets_a_one_line_error(target):
    with pytest.raises(DsparkError) as e:
        build_drafter("dspark", target)
    message = str(e.value)
    assert "no shipped dspark drafter for this target" in message and "tiny" in message
    assert "\n" not in message


def test_the_folder_is_chosen_by_the_targets_fingerprint(tmp_path, monkeypatch, target, tiny_qwen3):
    """Two shipped targets of the same shape (vocabulary, depth): the embedding/head hash decides."""
    other = TargetAdapter(type(tiny_qwen3)(tiny_qwen3.config))  # same shape, other random weights
    with torch.no_grad():
        other.model.get_input_embeddings().weight.normal_()
        other.model.get_output_embeddings().weight.normal_()
    save_drafter(tmp_path / "a" / "dflash", build("dflash", target), target)
    save_drafter(tmp_path / "b" / "dflash", build("dflash", other), other)
    monkeypatch.setattr(shipped, "shipped_root", lambda: tmp_path)
    assert shipped.shipped_targets("dflash") == ["a", "b"]
    assert shipped.shipped_drafter_dir("dflash", target) == tmp_path / "a" / "dflash"
    assert shipped.shipped_drafter_dir("dflash", other) == tmp_path / "b" / "dflash"
    assert build_drafter("dflash", other) is not None  # and it loads: the fingerprint matched
    with pytest.raises(DsparkError, match="shipped dspark drafters: none"):
        shipped.shipped_drafter_dir("dspark", target)
