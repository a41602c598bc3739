"""Checkpoint key layout of the drafters, straight from ``state_dict()`` (DESIGN §5.4)."""

from __future__ import annotations

import pytest
import torch

from .builders import build

V, H, NH, NKV, HD, I = 128, 64, 4, 2, 16, 128  # the tiny_qwen3 fixture
L = 3  # default feature layers of a 4-layer target: (0, 1, 2)
R = 8  # markov_rank of the test configs


def backbone_keys(num_layers: int) -> dict[str, tuple[int, ...]]:
    keys = {
        "embed_tokens.weight": (V, H),
        "fc.weight": (H, L * H),
        "hidden_norm.weight": (H,),
        "norm.weight": (H,),
        "lm_head.weight": (V, H),
    }
    for i in range(num_layers):
        p = f"layers.{i}."
        keys |= {
            p + "self_attn.q_proj.weight": (NH * HD, H),
            p + "self_attn.k_proj.weight": (NKV * HD, H),
            p + "self_attn.v_proj.weight": (NKV * HD, H),
            p + "self_attn.o_proj.weight": (H, NH * HD),
            p + "self_attn.q_norm.weight": (HD,),
            p + "self_attn.k_norm.weight": (HD,),
            p + "mlp.gate_proj.weight": (I, H),
            p + "mlp.up_proj.weight": (I, H),
            p + "mlp.down_proj.weight": (H, I),
            p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,),
        }
    return keys


def shapes(module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def test_dflash_keys(target):
    assert shapes(build("dflash", target)) == backbone_keys(2)


def test_dspark_markov_keys(target):
    expected = backbone_keys(2) | {
        "markov_head.markov_w1.weight": (V, R),
        "markov_head.markov_w2.weight": (V, R),
        "confidence_head.proj.weight": (1, H + R),
        "confidence_head.proj.bias": (1,),
    }
    assert shapes(build("dspark_markov", target)) == expected


def test_dspark_rnn_keys(target):
    expected = backbone_keys(2) | {
        "markov_head.markov_w1.weight": (V, R),
        "markov_head.markov_w2.weight": (V, R),
        "markov_head.joint_proj.weight": (3 * R, 2 * R + H),  # DeepSpec / SGLang names
        "markov_head.joint_proj.bias": (3 * R,),
        "confidence_head.proj.weight": (1, H + R),
        "confidence_head.proj.bias": (1,),
    }
    assert shapes(build("dspark_rnn", target)) == expected


def test_dspark_without_heads_is_dflash_layout(target):
    """DESIGN §5.4: DFlash = the DSpark class with markov_rank 0 and no confidence head."""
    drafter = build("dspark_markov", target, markov_rank=0, enable_confidence_head=False)
    assert shapes(drafter) == backbone_keys(2)


def test_eagle3_keys(target):
    p = "layers.0."
    expected = {
        "embed_tokens.weight": (V, H),
        "fc.weight": (H, L * H),
        p + "hidden_norm.weight": (H,),
        p + "input_layernorm.weight": (H,),
        p + "post_attention_layernorm.weight": (H,),
        p + "self_attn.q_proj.weight": (NH * HD, 2 * H),
        p + "self_attn.k_proj.weight": (NKV * HD, 2 * H),
        p + "self_attn.v_proj.weight": (NKV * HD, 2 * H),
        p + "self_attn.o_proj.weight": (H, NH * HD),
        p + "mlp.gate_proj.weight": (I, H),
        p + "mlp.up_proj.weight": (I, H),
        p + "mlp.down_proj.weight": (H, I),
        "norm.weight": (H,),
        "lm_head.weight": (V, H),
    }
    assert shapes(build("eagle3", target)) == expected


@pytest.mark.parametrize("name", ["dflash", "dspark_markov", "eagle3"])
def test_embedding_and_lm_head_are_frozen_copies_of_the_target(target, name):
    drafter = build(name, target)
    model = target.model
    assert torch.equal(drafter.embed_tokens.weight, model.get_input_embeddings().weight)
    assert torch.equal(drafter.lm_head.weight, model.get_output_embeddings().weight)
    assert not drafter.embed_tokens.weight.requires_grad
    assert not drafter.lm_head.weight.requires_grad
    trainable = {n for n, p in drafter.named_parameters() if p.requires_grad}
    assert "fc.weight" in trainable and "embed_tokens.weight" not in trainable


def test_from_target_resolves_and_validates(target):
    assert build("dflash", target).target_layer_ids == tuple(target.target_layer_ids)
    with pytest.raises(ValueError, match="target_layer_ids"):
        build("dflash", target, target_layer_ids=(0, 2))
    with pytest.raises(ValueError, match="mask_token_id"):
        build("dflash", target, mask_token_id=V)
    with pytest.raises(ValueError, match="mask token"):
        build("dspark_markov", target, mask_token_id=None)  # the adapter has no tokenizer
