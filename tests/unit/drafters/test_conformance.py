"""Every trained-drafter architecture plugs into the speculative loop losslessly (DESIGN §3).

Greedy speculative output must be the target's own greedy output, whether the drafter
is random (every draft rejected: rollback every round) or briefly trained on the
target's text (drafts accepted: several tokens committed per round, which the drafter's
context cache must absorb).
"""

from __future__ import annotations

import pytest
import torch

from dspark.decoding import speculative_generate
from dspark.protocols import SamplingParams
from dspark.training.objective import drafter_loss

from .builders import DRAFTERS, build, make_batch, prompt

N = 64
GREEDY = SamplingParams(temperature=0.0, max_tokens=N)


def plain_greedy(target, ids: list[int], n: int) -> list[int]:
    return target.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)[
        0, len(ids) :
    ].tolist()


@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_speculative_equals_plain_greedy(target, name):
    ids = prompt(7, seed=3)
    result = speculative_generate(target, build(name, target), ids, GREEDY)
    assert result.token_ids == plain_greedy(target, ids, N)
    assert sum(r.proposed for r in result.rounds) > 0


def fit_to_target(drafter, target, steps: int = 30):
    """A few AdamW steps on the target's greedy continuations of two prompts."""
    seqs = [torch.tensor(prompt(6, seed=s) + plain_greedy(target, prompt(6, seed=s), 34)) for s in range(2)]
    ids = torch.stack(seqs)  # [2, 40]
    loss_mask = torch.ones_like(ids, dtype=torch.bool)
    loss_mask[:, :6] = False
    batch = make_batch(target, ids, loss_mask)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-2)
    first = None
    for _ in range(steps):
        loss = drafter_loss(drafter.config, drafter.forward_train(batch)).loss
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first, "training did not reduce the loss"
    return drafter.eval()


@pytest.mark.parametrize("name", DRAFTERS)
def test_trained_drafter_gets_accepted_and_stays_lossless(target, name):
    drafter = fit_to_target(build(name, target).train(), target)
    ids = prompt(6, seed=1)
    result = speculative_generate(target, drafter, ids, GREEDY)
    assert result.token_ids == plain_greedy(target, ids, N)
    assert sum(r.accepted for r in result.rounds) > 0
