from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from dspark.targets import TargetAdapter


@pytest.fixture(scope="module")
def long_qwen3() -> TargetAdapter:
    """Random-init tiny Qwen3 with a 1024-token context, for 256+-token greedy runs."""
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return TargetAdapter(Qwen3ForCausalLM(config).eval())


def hf_greedy(target: TargetAdapter, prompt: list[int], n: int) -> list[int]:
    """Plain HF greedy decoding of exactly n tokens (EOS ignored)."""
    model = target.model
    # HF fills an unset eos_token_id from the model's own configs: clear those for the call.
    saved = model.generation_config.eos_token_id, model.config.eos_token_id
    model.generation_config.eos_token_id = model.config.eos_token_id = None
    try:
        config = GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=0)
        out = model.generate(torch.tensor([prompt]), generation_config=config)
    finally:
        model.generation_config.eos_token_id, model.config.eos_token_id = saved
    assert out.shape[1] == len(prompt) + n
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def no_eos(long_qwen3):
    """``long_qwen3`` that never stops at EOS (runs of exactly ``max_tokens``)."""
    long_qwen3.eos_token_ids = ()
    return long_qwen3


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    """A 30-token prompt that repeats itself."""
    g = torch.Generator().manual_seed(3)
    # A repetitive prompt gives the n-gram drafter something to find.
    base = torch.randint(3, 128, (12,), generator=g).tolist()
    return base + base[:6] + base
