from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from dspark.scheduler import SpsTable
from dspark.targets import TargetAdapter
from tests.conftest import TINY_DIMS

VOCAB = TINY_DIMS["vocab_size"]


@pytest.fixture(scope="module")
def target() -> TargetAdapter:
    """Random-init 4-layer Qwen3 (vocab 128, context 256); EOS off unless a test sets it."""
    torch.manual_seed(0)
    t = TargetAdapter(Qwen3ForCausalLM(Qwen3Config(**TINY_DIMS)).eval())
    t.eos_token_ids = ()
    t.model.generation_config.eos_token_id = None  # HF generate would stop at the config's EOS
    return t


@pytest.fixture(scope="module")
def sps() -> SpsTable:
    """A saturating cost curve: a step of B tokens takes 1 + B/12 time units, with a cliff at 48."""
    return SpsTable.from_dict({b: 1.0 / (1.0 + b / 12 + (0.8 if b > 48 else 0.0)) for b in range(1, 300)})


def greedy_references(
    target: TargetAdapter, prompts: list[list[int]], n: int
) -> list[tuple[list[int], float]]:
    """Plain HF greedy decoding of n tokens per prompt (one left-padded batch), and for each
    the smallest top-1/top-2 logit gap on its way (a near-tie could flip under rounding)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=n,
        eos_token_id=None,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_logits=True,
    )
    out = target.model.generate(ids, attention_mask=mask, generation_config=config)
    assert out.sequences.shape[1] == width + n
    top = torch.stack(out.logits, dim=1).topk(2, dim=-1).values  # [P, n, 2]
    gaps = (top[..., 0] - top[..., 1]).amin(dim=-1)  # [P]
    return [(seq[width:].tolist(), float(g)) for seq, g in zip(out.sequences, gaps)]


def make_prompts(count: int, seed: int, *, min_len: int = 4, max_len: int = 30) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(count):
        n = int(torch.randint(min_len, max_len + 1, (), generator=g))
        base = torch.randint(3, VOCAB, (max(2, n // 2),), generator=g).tolist()
        prompts.append((base * 3)[:n])  # repetitive, for the n-gram drafter
    return prompts
