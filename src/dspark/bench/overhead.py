"""What DSpark's sequential head costs in a round (DESIGN §5.3; paper Fig. 4 right: ≤ 1.3%).

A round = drafter backbone forward → draft sampling → target verification forward.
DFlash samples its K positions in parallel; DSpark samples them left to right, each
step adding the Markov (or RNN) bias of the token just drawn. The overhead is the
extra time of that sequential loop over parallel sampling, as a share of the round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dspark.protocols import SamplingParams, SequenceState
from dspark.sampling import batch_probs
from dspark.targets import TargetAdapter


@dataclass(frozen=True)
class RoundTimes:
    batch: int
    backbone_s: float  # drafter forward over the block (shared by both variants)
    parallel_sampling_s: float  # DFlash: sample all K positions at once
    sequential_sampling_s: float  # DSpark: Markov bias + sampling, position by position
    verify_s: float  # target forward over anchor + K drafts for every request

    @property
    def round_s(self) -> float:
        return self.backbone_s + self.sequential_sampling_s + self.verify_s

    @property
    def overhead(self) -> float:
        """Extra time of the sequential loop as a share of a DSpark round."""
        return (self.sequential_sampling_s - self.parallel_sampling_s) / self.round_s


def median_time(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls, after one warm-up call."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def _sample(p: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return torch.multinomial(p.reshape(-1, p.shape[-1]), 1, generator=g).reshape(p.shape[:-1])


@torch.no_grad()
def sequential_head_overhead(
    target: TargetAdapter, drafter, prompts: list[list[int]], *, repeats: int = 20, temperature: float = 1.0
) -> RoundTimes:
    """Time the parts of one round for ``len(prompts)`` requests at once (a DSpark drafter)."""
    assert drafter.markov_head is not None, "the drafter has no sequential head"
    params = [SamplingParams(temperature=temperature)] * len(prompts)
    states = []
    for r, ids in enumerate(prompts):
        out = target.forward(
            torch.tensor([ids[:-1]], device=target.device),
            target.new_cache(),
            layer_ids=drafter.target_layer_ids,
        )
        states.append(SequenceState(r, list(ids), len(ids), features=out.features[0]))
    drafter.backbone.prepare(states, params)
    K, R = drafter.block_size, len(states)
    g = torch.Generator().manual_seed(0)
    h = drafter.backbone.block_hidden_infer(states)[:, :K]  # [R, K, H]
    base = drafter.backbone.logits(h)  # [R, K, V]
    anchors = torch.tensor([s.token_ids[-1] for s in states])

    def backbone():
        drafter.backbone.logits(drafter.backbone.block_hidden_infer(states)[:, :K])

    def parallel():
        _sample(batch_probs(base, params), g)  # [R, K]

    def sequential():
        prev, head_state = anchors, drafter.markov_head.initial_state(R, h)
        for k in range(K):
            bias, _, head_state = drafter.markov_head.step(prev, h[:, k], head_state)
            p_k = batch_probs((base[:, k] + bias.float()).unsqueeze(1), params)  # [R, 1, V]
            prev = _sample(p_k, g)[:, 0]

    # One verification forward per request (batch 1 each, as the batch-1 loop runs it).
    caches = []
    for s in states:
        cache = target.new_cache()
        target.forward(torch.tensor([s.token_ids[:-1]], device=target.device), cache, with_features=False)
        caches.append(cache)
    block = torch.randint(0, target.vocab_size, (1, K))

    def verify():
        for s, cache in zip(states, caches):
            length = cache.length
            ids = torch.cat([torch.tensor([[s.token_ids[-1]]]), block], dim=1)
            target.forward(ids, cache, with_features=True, layer_ids=drafter.target_layer_ids)
            target.rollback(cache, length)

    return RoundTimes(
        batch=R,
        backbone_s=median_time(backbone, repeats),
        parallel_sampling_s=median_time(parallel, repeats),
        sequential_sampling_s=median_time(sequential, repeats),
        verify_s=median_time(verify, repeats),
    )
