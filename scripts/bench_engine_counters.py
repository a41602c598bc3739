"""Issue 17: the engine's own counters for a few variants of one cell, alternating in one process.

Each variant decodes the same greedy requests (tiny target, fp32, one thread); repeats
alternate the variants' order. Prints, per variant, the means over the repeats of the
process CPU seconds and of ``EngineStats`` (steps, rounds, tokens drafted / verified /
accepted, the forward's and the drafter's seconds, rounds per proposer), and ms per
``propose`` call. A variant is ``POLICY`` or ``POLICY@DTYPE``: ``payoff`` (the controller
over ``fixed``, the default of every path) or a static policy (``fixed``), with the drafter
cast to ``DTYPE`` (the target stays fp32).

    python scripts/bench_engine_counters.py DRAFTER PROMPTS.jsonl CONCURRENCY REPEATS payoff,fixed
    python scripts/bench_engine_counters.py dspark math 1 2 fixed,fixed@bfloat16
"""

from __future__ import annotations

import gc
import itertools
import sys
import time
from collections import defaultdict

import torch

from dspark.commands.loading import load_target
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.drafters.registry import build_drafter
from dspark.engine import Engine, EngineConfig
from dspark.protocols import SamplingParams

COUNTERS = (
    "steps",
    "rounds",
    "drafted",
    "verified",
    "accepted",
    "forward_tokens",
    "ngram_rounds",
    "model_rounds",
)
SECONDS = ("step_s", "forward_s", "draft_s", "update_s")


def variant_engine(target, name: str, variant: str, concurrency: int) -> Engine:
    policy, _, dtype = variant.partition("@")
    drafter = build_drafter(name, target)
    if dtype:
        drafter = drafter.to(getattr(torch, dtype))
    payoff = policy == "payoff"
    config = EngineConfig(
        block_size=7,
        policy="fixed" if payoff else policy,
        max_batch=concurrency,
        max_seq_len=1024,
        payoff=payoff,
    )
    return Engine(target, drafter, config)


def count_proposals(engine: Engine) -> list[float]:
    """Wrap ``engine``'s drafter's ``propose``: ``[seconds, calls]``, thread CPU time."""
    drafter, totals = engine.drafter, [0.0, 0]
    propose = drafter.propose

    def timed(*args, **kwargs):
        started = time.thread_time()
        out = propose(*args, **kwargs)
        totals[0] += time.thread_time() - started
        totals[1] += 1
        return out

    drafter.propose = timed
    return totals


def main(name: str, prompt_set: str, concurrency: int, repeats: int, variants: list[str]) -> None:
    torch.set_num_threads(1)
    target = load_target(None, dtype=torch.float32)
    ids = [prompt_ids(target.tokenizer, p) for p in load_prompts(prompt_set, 4)]
    prompts = list(itertools.islice(itertools.cycle(ids), max(concurrency, 4)))
    params = SamplingParams(temperature=0.0, max_tokens=64)
    engines = {v: variant_engine(target, name, v, concurrency) for v in variants}
    proposals = {v: count_proposals(e) for v, e in engines.items()}
    sums: dict[str, dict[str, float]] = {v: defaultdict(float) for v in variants}
    for repeat in range(repeats):
        for variant in variants if repeat % 2 == 0 else variants[::-1]:
            engine = engines[variant]
            engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
            engine.stats, proposals[variant][:] = type(engine.stats)(), [0.0, 0]
            gc.collect()
            started = time.process_time()
            outputs = engine.generate(prompts, params)
            row = sums[variant]
            row["cpu_s"] += time.process_time() - started
            for field in COUNTERS + SECONDS:
                row[field] += getattr(engine.stats, field)
            row["propose_ms"] += 1e3 * proposals[variant][0] / max(proposals[variant][1], 1)
            row["tokens"] += sum(len(o.token_ids) for o in outputs)
    for variant, row in sums.items():
        print(variant, " ".join(f"{k}={v / repeats:.4g}" for k, v in row.items()))


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(","))
