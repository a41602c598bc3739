"""Drafter presets (DESIGN §5): the paper's settings, the tiny target's mask token, a debug preset."""

from __future__ import annotations

import dataclasses

import pytest

from dspark.drafters.dflash import DFlashConfig
from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
from dspark.drafters.eagle3 import Eagle3Config
from dspark.presets import drafters as presets
from dspark.protocols import SamplingParams
from dspark.tiny.tokenizer import MASK_TOKEN, train_tokenizer

from .builders import MASK_ID, make_state, prompt

ALL = [
    presets.dflash_tiny, presets.dspark_tiny, presets.dspark_rnn_tiny, presets.eagle3_tiny,
    presets.dflash_qwen3_8b, presets.dspark_qwen3_8b, presets.eagle3_qwen3_8b, presets.dspark_debug,
]  # fmt: skip


@pytest.mark.parametrize("preset", ALL)
def test_presets_are_frozen_configs(preset):
    config = preset()
    assert isinstance(config, DFlashConfig | DSparkConfig | Eagle3Config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.block_size = 3


def test_qwen3_8b_follows_the_paper():
    dspark = presets.dspark_qwen3_8b()
    assert (dspark.num_layers, dspark.block_size, dspark.markov_rank) == (5, 7, 256)
    assert dspark.markov_head_type == "vanilla" and dspark.enable_confidence_head
    assert dspark.target_layer_ids == (1, 9, 17, 25, 33) and dspark.mask_token_id == 151669
    objective = dspark.objective
    assert (objective.ce, objective.tv, objective.conf, objective.decay) == (0.1, 0.9, 1.0, 4.0)
    dflash = presets.dflash_qwen3_8b()
    assert (dflash.num_layers, dflash.block_size, dflash.objective.ce, dflash.objective.tv) == (
        5,
        7,
        1.0,
        0.0,
    )
    eagle = presets.eagle3_qwen3_8b()
    assert eagle.block_size == 7 and eagle.objective.geometric == 0.8 and eagle.objective.soft_ce == 1.0


def test_tiny_presets_use_the_tiny_tokenizers_mask_token():
    tokenizer = train_tokenizer(["a small corpus for a small tokenizer"] * 4, vocab_size=300)
    assert tokenizer.convert_tokens_to_ids(MASK_TOKEN) == presets.TINY_MASK_TOKEN_ID
    assert presets.dspark_tiny().mask_token_id == presets.TINY_MASK_TOKEN_ID


def test_debug_preset_drafts(target):
    drafter = DSparkDrafter.from_target(target, presets.dspark_debug(MASK_ID))
    block = drafter.propose([make_state(target, prompt(6))], 8, [SamplingParams(seed=0)])
    assert block.tokens.shape == (1, 4) and block.confidences.shape == (1, 4)
