"""Drafter folders: DeepSpec key layout, round trip, strict validation (DESIGN §5.4)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark.drafters.dflash import DFlashConfig, DFlashDrafter
from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
from dspark.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from dspark.drafters.registry import TRAINABLE
from dspark.formats.folder import DrafterLoadError, load_drafter, save_drafter
from dspark.protocols import SamplingParams, SequenceState
from dspark.targets import TargetAdapter

MASK = 5


@pytest.fixture
def target(tiny_qwen3) -> TargetAdapter:
    return TargetAdapter(tiny_qwen3)


def _deepspec_keys(layers: int, markov: bool, conf: bool) -> set[str]:
    keys = {"embed_tokens.weight", "fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight"}
    for i in range(layers):
        keys |= {f"layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"}
        keys |= {f"layers.{i}.self_attn.{p}_norm.weight" for p in "qk"}
        keys |= {f"layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        keys |= {f"layers.{i}.input_layernorm.weight", f"layers.{i}.post_attention_layernorm.weight"}
    if markov:
        keys |= {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight"}
    if conf:
        keys |= {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    return keys


def _make(kind: str, target):
    torch.manual_seed(0)
    if kind == "dspark":
        d = DSparkDrafter.from_target(
            target, DSparkConfig(num_layers=2, block_size=4, mask_token_id=MASK, markov_rank=8)
        )
    elif kind == "dflash":
        d = DFlashDrafter.from_target(target, DFlashConfig(num_layers=2, block_size=4, mask_token_id=MASK))
    else:
        d = Eagle3Drafter.from_target(target, Eagle3Config(block_size=4))
    for p in d.parameters():  # non-trivial trainable weights (W_2 starts at zero)
        if p.requires_grad:
            p.data.normal_(0, 0.1)
    return d.eval()


def _draft(drafter, target, seed=0):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(6, target.vocab_size, (1, 12), generator=g)
    out = target.forward(ids[:, :-1], target.new_cache())
    state = SequenceState(0, ids[0].tolist(), 12, features=out.features[0])
    return drafter.propose([state], 4, [SamplingParams(temperature=1.0, seed=seed)])


@pytest.mark.parametrize("kind", TRAINABLE)
def test_round_trip_gives_identical_drafts(tmp_path, target, kind):
    drafter = _make(kind, target)
    save_drafter(tmp_path / "d", drafter, target)
    loaded = load_drafter(tmp_path / "d", target)
    a, b = _draft(drafter, target), _draft(loaded, target)
    assert torch.equal(a.tokens, b.tokens) and torch.allclose(a.probs, b.probs, atol=0, rtol=0)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["dspark_method"] == kind and config["block_size"] == 4
    assert config["num_target_layers"] == target.num_layers and config["vocab_size"] == target.vocab_size


def test_deepspec_layout_state_dict_loads(tmp_path, target):
    """A folder written the way DeepSpec lays out DSpark (no dspark_method field) loads."""
    drafter = _make("dspark", target)
    state = drafter.state_dict()
    assert set(state) == _deepspec_keys(2, markov=True, conf=True)
    folder = tmp_path / "deepspec"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    cfg = target.config.to_dict() | {
        "architectures": ["Qwen3DSparkModel"],
        "block_size": 4,
        "num_target_layers": target.num_layers,
        "target_layer_ids": list(target.target_layer_ids),
        "mask_token_id": MASK,
        "markov_rank": 8,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "num_hidden_layers": 2,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    loaded = load_drafter(folder, target)
    assert isinstance(loaded, DSparkDrafter)
    assert torch.equal(_draft(loaded, target).probs, _draft(drafter, target).probs)


@pytest.fixture
def saved(tmp_path, target):
    return save_drafter(tmp_path / "d", _make("dspark", target), target)


def _edit_weights(folder, fn):
    state = load_file(str(folder / "model.safetensors"))
    fn(state)
    save_file(state, str(folder / "model.safetensors"))


def test_missing_key_is_named(saved, target):
    _edit_weights(saved, lambda s: s.pop("confidence_head.proj.bias"))
    with pytest.raises(DrafterLoadError, match=r"missing keys \['confidence_head.proj.bias'\]"):
        load_drafter(saved, target)


def test_unexpected_key_is_named(saved, target):
    _edit_weights(saved, lambda s: s.update({"extra.weight": torch.zeros(2)}))
    with pytest.raises(DrafterLoadError, match=r"unexpected keys \['extra.weight'\]"):
        load_drafter(saved, target)


def test_shape_mismatch_is_named(saved, target):
    _edit_weights(saved, lambda s: s.update({"fc.weight": torch.zeros(3, 3)}))
    with pytest.raises(DrafterLoadError, match="fc.weight"):
        load_drafter(saved, target)


def test_block_size_mismatch_is_refused(saved, target):
    with pytest.raises(DrafterLoadError, match="block_size 4 != the requested 7"):
        load_drafter(saved, target, block_size=7)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("vocab_size", 999, "vocab_size 999"),
        ("hidden_size", 32, "hidden_size 32"),
        ("num_target_layers", 36, "num_target_layers 36"),
        ("target_layer_ids", [0, 40], "target_layer_ids"),
        ("mask_token_id", 10_000, "mask_token_id 10000"),
        ("block_size", 0, "block_size 0"),
    ],
)
def test_config_mismatch_with_target_is_refused(saved, target, field, value, message):
    path = saved / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {field: value}))
    with pytest.raises(DrafterLoadError, match=message):
        load_drafter(saved, target)


def test_corrupt_weights_are_refused(saved, target):
    (saved / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(DrafterLoadError, match="cannot read weights"):
        load_drafter(saved, target)


def test_drafter_of_another_target_with_the_same_shape_is_refused(saved, tiny_qwen3):
    torch.manual_seed(123)
    other = TargetAdapter(type(tiny_qwen3)(tiny_qwen3.config).eval())
    with pytest.raises(DrafterLoadError, match="trained for another target"):
        load_drafter(saved, other)
