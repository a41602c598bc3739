"""Named drafter configs (DESIGN §5): one function per preset, no flags.

``*_tiny`` fit the embedded tiny target (DESIGN §11: 12 layers, hidden 256), where a 1-2
layer drafter costs ≤ 15% of a target forward; ``*_qwen3_8b`` follow the paper's setup
(γ = 7, 5 DFlash/DSpark layers, 1 Eagle3 layer, DeepSpec's feature layers);
``dspark_debug`` is the smallest useful drafter, for tests on random tiny targets.
Dimensions always come from the target (``Drafter.from_target``).
"""

from __future__ import annotations

from dspark.drafters.dflash import DFlashConfig
from dspark.drafters.dspark import DSparkConfig
from dspark.drafters.eagle3 import Eagle3Config
from dspark.tiny.tokenizer import MASK_TOKEN, SPECIAL_TOKENS

# The tiny tokenizer gives its special tokens the first ids, in order.
TINY_MASK_TOKEN_ID = SPECIAL_TOKENS.index(MASK_TOKEN)
# Qwen3: an id past the tokenizer's added tokens, inside the 151936-row embedding (DESIGN §5.1).
QWEN3_MASK_TOKEN_ID = 151669
# DeepSpec's spread over 36 layers (Qwen3-4B and Qwen3-8B both have 36).
QWEN3_36_LAYER_IDS = (1, 9, 17, 25, 33)


def dflash_tiny() -> DFlashConfig:
    return DFlashConfig(num_layers=2, block_size=7, mask_token_id=TINY_MASK_TOKEN_ID)


def dspark_tiny() -> DSparkConfig:
    return DSparkConfig(num_layers=2, block_size=7, mask_token_id=TINY_MASK_TOKEN_ID, markov_rank=64)


def dspark_rnn_tiny() -> DSparkConfig:
    return DSparkConfig(
        num_layers=2, block_size=7, mask_token_id=TINY_MASK_TOKEN_ID, markov_rank=64, markov_head_type="rnn"
    )


def eagle3_tiny() -> Eagle3Config:
    return Eagle3Config(block_size=7)


# SmolLM2-135M-Instruct (hidden 576, 30 layers, vocabulary 49,152, no mask token: the
# drafter uses the tokenizer's default). Two draft layers, as for the tiny target.
def dflash_smollm2() -> DFlashConfig:
    return DFlashConfig(num_layers=2, block_size=7)


def dspark_smollm2() -> DSparkConfig:
    return DSparkConfig(num_layers=2, block_size=7, markov_rank=64)


def eagle3_smollm2() -> Eagle3Config:
    return Eagle3Config(block_size=7)


def dspark_smollm2_v8k() -> DSparkConfig:
    """``dspark_smollm2`` proposing from the 8,192 most frequent training tokens:
    its folder is 24.9 MB in bf16 (30.1 MB over the whole 49,152-token vocabulary)."""
    return DSparkConfig(num_layers=2, block_size=7, markov_rank=64, draft_vocab_size=8192)


def dspark_qwen3_8b() -> DSparkConfig:
    return DSparkConfig(
        num_layers=5,
        block_size=7,
        target_layer_ids=QWEN3_36_LAYER_IDS,
        mask_token_id=QWEN3_MASK_TOKEN_ID,
        markov_rank=256,
    )


def dflash_qwen3_8b() -> DFlashConfig:
    return DFlashConfig(
        num_layers=5, block_size=7, target_layer_ids=QWEN3_36_LAYER_IDS, mask_token_id=QWEN3_MASK_TOKEN_ID
    )


def eagle3_qwen3_8b() -> Eagle3Config:
    return Eagle3Config(block_size=7, target_layer_ids=QWEN3_36_LAYER_IDS)


def dspark_debug(mask_token_id: int | None = None) -> DSparkConfig:
    """One layer, γ = 4, rank 8: for tests on random targets (pass their mask token id)."""
    return DSparkConfig(num_layers=1, block_size=4, mask_token_id=mask_token_id, markov_rank=8)
