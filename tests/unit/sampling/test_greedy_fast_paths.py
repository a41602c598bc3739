"""The greedy shortcuts of issue 17 return exactly what the general code returned.

``process_logits`` at temperature 0 skips the softmax; ``verify`` with every request greedy
skips the V-wide residual and inverse-CDF work. A batch that mixes in one sampled request
still takes the general path, and its greedy rows must come out the same.
"""

from __future__ import annotations

import pytest
import torch

from dspark.protocols import SamplingParams
from dspark.sampling.probs import _process, batch_probs, process_logits
from dspark.sampling.rejection import verify


def test_greedy_processing_equals_the_general_code():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 64, generator=g)
    logits[0, 0, 7] = logits[0, 0, 9] = logits[0, 0].max() + 1  # a tie: the lowest id wins
    general = _process(
        logits,
        temperature=torch.tensor(0.0),
        top_k=torch.tensor(5),
        top_p=torch.tensor(0.9),
    )
    fast = process_logits(logits, SamplingParams(temperature=0.0, top_k=5, top_p=0.9))
    assert torch.equal(fast, general) and fast.dtype == torch.float32
    assert int(fast[0, 0].argmax()) == 7
    bf16 = logits.bfloat16()
    greedy_bf16 = batch_probs(bf16, [SamplingParams(temperature=0.0)] * 3)
    assert greedy_bf16.dtype == torch.float32
    assert torch.equal(
        greedy_bf16,
        _process(bf16, temperature=torch.tensor(0.0), top_k=torch.tensor(0), top_p=torch.tensor(1.0)),
    )


@pytest.mark.parametrize("seed", range(6))
def test_all_greedy_verification_equals_the_general_path(seed):
    g = torch.Generator().manual_seed(seed)
    R, K, V = 5, 6, 16
    target = torch.softmax(3 * torch.randn(R + 1, K + 1, V, generator=g), dim=-1)
    target_probs = torch.zeros_like(target).scatter_(-1, target.argmax(-1, keepdim=True), 1.0)
    argmax = target_probs.argmax(-1)  # [R+1, K+1]
    # drafts that follow the target's argmax for a random prefix, then differ
    tokens = torch.randint(0, V, (R + 1, K), generator=g)
    for r in range(R + 1):
        n = int(torch.randint(0, K + 1, (), generator=g))
        tokens[r, :n] = argmax[r, :n]
    lengths = torch.randint(0, K + 1, (R + 1,), generator=g)
    draft_probs = torch.softmax(torch.randn(R + 1, K, V, generator=g), dim=-1)

    def run(rows: int, greedy: list[bool]):
        generators = [torch.Generator().manual_seed(100 + r) for r in range(rows)]
        out = verify(
            tokens[:rows],
            lengths[:rows],
            draft_probs[:rows],
            target_probs[:rows] if all(greedy) else torch.cat([target_probs[:R], target[R:]]),
            greedy=torch.tensor(greedy),
            generators=generators,
        )
        return out, generators

    fast, fast_generators = run(R, [True] * R)
    general, general_generators = run(R + 1, [True] * R + [False])  # one sampled row: the general path
    assert torch.equal(fast.num_accepted, general.num_accepted[:R])
    assert torch.equal(fast.next_tokens, general.next_tokens[:R])
    # every generator advanced as in the general path
    assert [x.get_state().tolist() for x in fast_generators] == [
        x.get_state().tolist() for x in general_generators[:R]
    ]
