"""Engine overhead: the share of a step spent outside model forwards (goal: < 15 % at batch 32).

Runs ``batch`` requests through a fresh engine as one continuous batch, after a short
warm-up, and splits the step time into the target forward, the drafter's ``propose``
and the rest (admission, scheduling, rejection sampling, commit, streaming), which is
the engine's own overhead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from dspark.engine.engine import Engine, EngineConfig
from dspark.protocols import Drafter, SamplingParams
from dspark.scheduler import SpsTable
from dspark.targets import TargetAdapter
from dspark.targets.flat import KVStore, Run, flat_forward


@dataclass(frozen=True)
class OverheadReport:
    batch: int
    policy: str
    steps: int
    step_ms: float  # mean wall time of a step
    target_ms: float  # of which the target forward
    draft_ms: float  # of which drafter.propose and drafter.update
    other_ms: float  # everything else: the engine's overhead
    overhead_share: float  # other_ms / step_ms
    mean_batch_tokens: float  # B of the verification forward
    tau: float
    tokens_per_s: float

    def as_dict(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}


def random_prompts(vocab_size: int, count: int, length: int, seed: int = 0) -> list[list[int]]:
    """Prompts of repeated random phrases (something for an n-gram drafter to find)."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(count):
        phrase = torch.randint(3, vocab_size, (max(4, length // 4),), generator=g).tolist()
        prompts.append((phrase * 4)[:length])
    return prompts


def engine_overhead(
    target: TargetAdapter,
    drafter: Drafter | None,
    prompts: list[list[int]],
    *,
    batch: int = 32,
    policy: str = "prefix",
    max_tokens: int = 64,
    temperature: float = 0.0,
    sps: SpsTable | None = None,
    block_size: int = 7,
) -> OverheadReport:
    """Decode ``batch`` prompts at once and report where a step's time goes."""
    assert len(prompts) >= batch, f"need {batch} prompts, got {len(prompts)}"
    config = EngineConfig(
        payoff=False,
        policy=policy,
        max_batch=batch,
        block_size=block_size,
        max_seq_len=max(map(len, prompts)) + max_tokens + 1,
        prefill_chunk=sum(map(len, prompts)),  # prefill in one step, so decode steps are measured alone
    )
    engine = Engine(target, drafter, config, sps=sps)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=0)
    engine.generate(prompts[:2], params)  # warm-up
    engine.stats = type(engine.stats)()
    for p in prompts[:batch]:
        engine.submit(p, params)
    engine.step()  # the prefill step: not a decode step
    prefill = dataclasses.replace(engine.stats)
    while engine.has_work():
        engine.step()
    s = engine.stats
    steps = s.steps - prefill.steps
    step_s = s.step_s - prefill.step_s
    forward_s = s.forward_s - prefill.forward_s
    draft_s = s.draft_s + s.update_s - prefill.draft_s - prefill.update_s
    other_s = step_s - forward_s - draft_s
    return OverheadReport(
        batch=batch,
        policy=policy,
        steps=steps,
        step_ms=1e3 * step_s / steps,
        target_ms=1e3 * forward_s / steps,
        draft_ms=1e3 * draft_s / steps,
        other_ms=1e3 * other_s / steps,
        overhead_share=other_s / step_s,
        mean_batch_tokens=(s.forward_tokens - prefill.forward_tokens) / steps,
        tau=s.tau,
        tokens_per_s=s.emitted / step_s,
    )


@dataclass(frozen=True)
class LayoutReport:
    """Flattened runs vs the same runs padded to the longest (the padded-batch design)."""

    requests: int
    tokens: int  # real tokens in the step
    padded_tokens: int  # tokens a padded [R, T_max] batch computes
    flat_ms: float  # fastest of the repeats
    padded_ms: float

    def as_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}


def flat_vs_padded(
    target: TargetAdapter, lengths: list[int], *, context: int = 256, repeats: int = 7
) -> LayoutReport:
    """Time one verification forward of runs of ``lengths`` tokens (``context`` cached each),
    flattened (what the engine runs) and padded to the longest run (every run computes
    ``max(lengths)`` tokens, as an ``[R, T_max]`` padded batch would)."""
    import time

    R = len(lengths)
    store = KVStore.for_target(target, num_slots=R, capacity=context + max(lengths))
    g = torch.Generator().manual_seed(0)

    def setup(run_lengths: list[int]):
        runs = [Run(slot=r, start=context, length=n) for r, n in enumerate(run_lengths)]
        ids = torch.randint(0, target.vocab_size, (sum(run_lengths),), generator=g)
        return runs, ids, torch.arange(sum(run_lengths))

    cases = {"flat": setup(lengths), "padded": setup([max(lengths)] * R)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(repeats + 1):  # interleaved, so machine drift hits both alike
        for name, (runs, ids, rows) in cases.items():
            started = time.perf_counter()
            flat_forward(target, store, ids, runs, logits_at=rows)
            if i:
                times[name].append(time.perf_counter() - started)
    flat_ms, padded_ms = (1e3 * min(times[name]) for name in cases)  # noise only adds time

    return LayoutReport(
        requests=R,
        tokens=sum(lengths),
        padded_tokens=R * max(lengths),
        flat_ms=flat_ms,
        padded_ms=padded_ms,
    )
