"""Loading a target from disk: safetensors round trip, clear errors, no remote code (DESIGN §4)."""

from __future__ import annotations

import pytest
import torch

from dspark.errors import DsparkError
from dspark.targets import TargetAdapter, TargetLoadError
from dspark.targets import adapter as adapter_module


def test_save_and_load_round_trip(tiny_qwen3, tiny_tokenizer, tmp_path):
    tiny_qwen3.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()

    target = TargetAdapter.from_pretrained(tmp_path, target_layer_ids=(-1, 1))
    ids = torch.tensor([[5, 17, 99, 3, 42]])
    with torch.no_grad():
        expected = tiny_qwen3(ids).logits
    torch.testing.assert_close(target.forward(ids, target.new_cache()).logits, expected, atol=1e-5, rtol=0)
    assert target.target_layer_ids == (-1, 1)
    assert target.eos_token_ids == (2,)
    assert target.tokenizer.convert_tokens_to_ids("w5") == 5
    assert not target.model.training
    assert not any(p.requires_grad for p in target.model.parameters())


def test_load_in_bf16_still_gives_fp32_logits(tiny_qwen3, tiny_tokenizer, tmp_path):
    tiny_qwen3.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    target = TargetAdapter.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert target.dtype == torch.bfloat16
    assert target.forward(torch.tensor([[5, 6, 7]]), target.new_cache()).logits.dtype == torch.float32


def test_missing_path_raises_clear_error(tmp_path):
    with pytest.raises(TargetLoadError, match="no such folder"):
        TargetAdapter.from_pretrained(tmp_path / "no-such-model")
    assert issubclass(TargetLoadError, DsparkError) and issubclass(TargetLoadError, ValueError)


def test_unknown_hub_id_raises_clear_error():
    with pytest.raises(
        TargetLoadError, match="cannot load target 'no-such-org/no-such-model' as a hub model"
    ):
        TargetAdapter.from_pretrained("no-such-org/no-such-model")


def test_folder_without_config_raises_clear_error(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(TargetLoadError, match="not a model folder"):
        TargetAdapter.from_pretrained(tmp_path)


@pytest.mark.parametrize("asked", [None, True])
def test_trust_remote_code_is_off_unless_asked(monkeypatch, tiny_qwen3, tiny_tokenizer, tmp_path, asked):
    calls = {}

    class FakeAuto:
        def __init__(self, name, result):
            self.name, self.result = name, result

        def from_pretrained(self, source, **kwargs):
            calls[self.name] = kwargs
            return self.result

    monkeypatch.setattr(adapter_module, "AutoModelForCausalLM", FakeAuto("model", tiny_qwen3))
    monkeypatch.setattr(adapter_module, "AutoTokenizer", FakeAuto("tokenizer", tiny_tokenizer))
    kwargs = {} if asked is None else {"trust_remote_code": asked}
    TargetAdapter.from_pretrained("org/some-model", **kwargs)

    expected = bool(asked)
    assert calls["model"]["trust_remote_code"] is expected
    assert calls["tokenizer"]["trust_remote_code"] is expected
    assert calls["model"]["use_safetensors"] is True
