"""Seeded, KB-sized random-init targets of every family in ``dspark.targets.families``.

Same shape as tests/conftest.py's tiny models (vocab 128, hidden 64, 4 layers); each
family keeps its own quirks (GPT-2's learned positions and LayerNorm, NeoX's partial
RoPE, Phi-3's fused projections, Gemma's scaled embeddings and softcaps).
"""

from __future__ import annotations

import torch
import transformers as hf

from dspark.targets import TargetAdapter
from tests.conftest import TINY_DIMS

_COMMON = {k: TINY_DIMS[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")}
_COMMON |= dict(
    max_position_embeddings=256, initializer_range=0.1, bos_token_id=1, eos_token_id=2, pad_token_id=0
)
_GQA = dict(intermediate_size=128, num_key_value_heads=2, head_dim=16)
_GEMMA = dict(query_pre_attn_scalar=16, sliding_window=6, final_logit_softcapping=2.0)

CONFIGS = {
    "llama": lambda: hf.LlamaConfig(**_COMMON, **_GQA, tie_word_embeddings=False),
    "mistral": lambda: hf.MistralConfig(**_COMMON, **_GQA, sliding_window=None),
    "qwen2": lambda: hf.Qwen2Config(**_COMMON, intermediate_size=128, num_key_value_heads=2),
    "qwen3": lambda: hf.Qwen3Config(**_COMMON, **_GQA),
    "gemma2": lambda: hf.Gemma2Config(**_COMMON, **_GQA, **_GEMMA, attn_logit_softcapping=5.0),
    "gemma3_text": lambda: hf.Gemma3TextConfig(
        **_COMMON, **_GQA, **_GEMMA, layer_types=["sliding_attention", "full_attention"] * 2
    ),
    "phi3": lambda: hf.Phi3Config(**_COMMON, intermediate_size=128, num_key_value_heads=2),
    "gpt2": lambda: hf.GPT2Config(
        vocab_size=128,
        n_embd=64,
        n_layer=4,
        n_head=4,
        n_positions=256,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
    ),  # fmt: skip
    "gpt_neox": lambda: hf.GPTNeoXConfig(**_COMMON, intermediate_size=128, rotary_pct=0.5),
}
FAMILIES = list(CONFIGS)


def build_model(family: str, seed: int = 0):
    torch.manual_seed(seed)
    return hf.AutoModelForCausalLM.from_config(CONFIGS[family]()).to(torch.float32).eval()


def build_target(family: str, seed: int = 0) -> TargetAdapter:
    """The family's tiny model behind the adapter, EOS off (every test decodes a fixed length)."""
    model = build_model(family, seed)
    model.generation_config.eos_token_id = None
    target = TargetAdapter(model)
    target.eos_token_ids = ()
    return target
