"""Shared test fixtures: tiny random-init targets of each first-class family (DESIGN §1).

Every model here is fp32, seeded, a few hundred KB, and builds in milliseconds, so a
test can afford a fresh one. Weights use a larger init range than HF's default (0.02)
so that logits are O(1): a wrong position, mask or cache entry then moves them well
beyond the 1e-5 tolerances the tests use.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# No test may touch the network (DESIGN §11: everything runs offline). Set before any
# transformers / huggingface_hub import reads it.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# SPS profiles of the tests' throwaway targets stay out of the user's cache (one folder per run,
# removed when the run ends).
if "DSPARK_SPS_DIR" not in os.environ:
    os.environ["DSPARK_SPS_DIR"] = tempfile.mkdtemp(prefix="dspark-sps-")
    atexit.register(shutil.rmtree, os.environ["DSPARK_SPS_DIR"], ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import (  # noqa: E402
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen3Config,
    Qwen3ForCausalLM,
)

TINY_VOCAB = 128
TINY_DIMS = dict(
    vocab_size=TINY_VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


# The fast lane, ``pytest -m "not slow"``: every package's unit tests. The tests that run
# commands end to end, the real server, the engines' own code or a GPU are slow by where
# they live.
SLOW_DIRS = frozenset({"integration", "interop", "gpu"})


def pytest_collection_modifyitems(config, items) -> None:
    tests = Path(__file__).parent
    for item in items:
        if item.path.relative_to(tests).parts[0] in SLOW_DIRS:
            item.add_marker(pytest.mark.slow)


def _build(model_cls: type[PreTrainedModel], config, seed: int) -> PreTrainedModel:
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    return model.eval()


@pytest.fixture
def tiny_qwen3() -> Qwen3ForCausalLM:
    """Random-init 4-layer Qwen3 (hidden 64, vocab 128, q/k norm), fp32, eval mode."""
    config = Qwen3Config(**TINY_DIMS, tie_word_embeddings=False)
    return _build(Qwen3ForCausalLM, config, seed=0)


@pytest.fixture
def tiny_llama() -> LlamaForCausalLM:
    """Random-init 4-layer Llama (hidden 64, vocab 128), fp32, eval mode."""
    config = LlamaConfig(**TINY_DIMS, tie_word_embeddings=False)
    return _build(LlamaForCausalLM, config, seed=1)


@pytest.fixture
def tiny_gemma() -> Gemma2ForCausalLM:
    """Random-init 4-layer Gemma2: scaled embeddings, logit softcapping, sliding window.

    The softcap (2.0) and window (6) are far below Gemma2's real values (30.0, 4096) so
    that both visibly change the outputs of 10-20-token test sequences.
    """
    config = Gemma2Config(
        **TINY_DIMS,
        query_pre_attn_scalar=16,
        sliding_window=6,
        final_logit_softcapping=2.0,
        attn_logit_softcapping=5.0,
    )
    return _build(Gemma2ForCausalLM, config, seed=2)


@pytest.fixture
def tiny_gemma3() -> Gemma3ForCausalLM:
    """Random-init 4-layer Gemma3 text: scaled embeddings, q/k norm, local/global RoPE, window 6."""
    config = Gemma3TextConfig(
        **TINY_DIMS,
        query_pre_attn_scalar=16,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"] * 2,
        final_logit_softcapping=2.0,
    )
    return _build(Gemma3ForCausalLM, config, seed=3)


@pytest.fixture
def tiny_tokenizer():
    """A word-level fast tokenizer over ``TINY_VOCAB`` ids: "<pad>" "<s>" "</s>" then "w3".."w127"."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab |= {f"w{i}": i for i in range(len(specials), TINY_VOCAB)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<pad>"
    )


# Tiny models run fastest on one thread, and the suite must not fight other jobs on a
# 2-core machine with OpenMP barriers (oversubscription slows everything down ~10x).
torch.set_num_threads(1)
