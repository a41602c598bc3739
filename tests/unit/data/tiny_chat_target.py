"""A random-init Qwen3 with a small BPE tokenizer and the tiny target's ChatML template.

Shaped like the embedded tiny target (DESIGN §11) in miniature, saved as an ordinary HF
folder, so the data pipeline runs the same code as on a real target. Builds in well
under a second.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from dspark.tiny.tokenizer import IM_END, MASK_TOKEN, PAD_TOKEN, train_tokenizer

VOCAB = 320  # 256 bytes + 4 special tokens + a few merges
_CORPUS = [
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "def add(a, b):\n    return a + b\n",
    "Explain how a hash table resolves collisions.",
    "The quick brown fox jumps over the lazy dog. " * 3,
]


def build_tiny_chat_target(
    folder: Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 4,
    intermediate_size: int | None = None,
    max_position: int = 512,
) -> Path:
    """Save the model and tokenizer to ``folder``; returns it.

    ``hidden_size=256, num_layers=12, intermediate_size=768, max_position=1024`` is the
    embedded tiny target's shape (DESIGN §11), for benchmarks before its weights exist.
    """
    tok = train_tokenizer(_CORPUS * 20, VOCAB)
    eos, pad = tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(PAD_TOKEN)
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=max_position,
        initializer_range=0.1,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def mask_token_id(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids(MASK_TOKEN)
