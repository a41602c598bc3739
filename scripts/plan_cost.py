"""Thread CPU time of one payoff plan, request by request against the whole batch at once (issue 17).

The engine prices a round with ``plan_each`` up to ``SMALL_BATCH`` requests and with
``plan_batch`` above (``engine/payoff_plan.py``); both make the same decisions (tested).
This runs the same greedy requests through both, three times each, alternating, tiny
target, fp32, one thread, and prints the mean CPU milliseconds per plan call (a quiet
batch's reused plans included) at each concurrency: where the crossover lies.

    python scripts/plan_cost.py DRAFTER PROMPTS.jsonl 1,4,16,32,64

Instrumentation by wrapping internals: a benchmark aid, not an API.
"""

import itertools
import sys
import time

import torch

import dspark.engine.payoff_drafting as PD
from dspark.commands.loading import load_inference_target
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.drafters.registry import build_drafter
from dspark.engine import Engine, EngineConfig
from dspark.protocols import SamplingParams

torch.set_num_threads(1)
target = load_inference_target(None, "float32")
drafter = build_drafter(sys.argv[1], target)
ids = [prompt_ids(target.tokenizer, p) for p in load_prompts(sys.argv[2], 4)]
PATHS = {"batch": 0, "each": 1 << 20}  # small_batch forcing one plan or the other
seconds: dict[int, float] = {}
calls: dict[int, int] = {}
plan = PD.PayoffDrafting.plan


def timed_plan(self, decoding, K):
    started = time.thread_time()
    out = plan(self, decoding, K)
    seconds[self.small_batch] = seconds.get(self.small_batch, 0.0) + time.thread_time() - started
    calls[self.small_batch] = calls.get(self.small_batch, 0) + 1
    return out


PD.PayoffDrafting.plan = timed_plan
for c in map(int, sys.argv[3].split(",")):
    seconds.clear(), calls.clear()
    reqs = list(itertools.islice(itertools.cycle(ids), max(c, 4)))
    for _ in range(3):
        for small_batch in PATHS.values():
            config = EngineConfig(block_size=7, policy="fixed", max_batch=c, max_seq_len=512, payoff=True)
            engine = Engine(target, drafter, config)
            engine.payoff.small_batch = small_batch
            engine.generate(reqs, SamplingParams(temperature=0.0, max_tokens=64))
    ms = {path: 1e3 * seconds[sb] / calls[sb] for path, sb in PATHS.items()}
    print(f"c={c}: per request {ms['each']:.3f} ms/plan, batch {ms['batch']:.3f} ms/plan")
