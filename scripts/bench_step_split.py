"""Where a payoff run's time goes, step by step, beside plain decoding's (issue 17).

Per repeat, the same greedy requests decoded plainly, then by DRAFTER under payoff control
(each engine warmed up on one request first, as ``dspark bench matrix`` does): process CPU
seconds of each run, and its steps split into those that carry a prefill chunk (or wait on
one: some request still queued) and those that only decode, and the steps in which some
request drafted or probed, with the model or the n-gram. At 64 requests on aime25 most of
a run is prefill, identical work in both modes: that share, and its scatter between two
plain runs, bound what speculation can change there.

    python scripts/bench_step_split.py DRAFTER PROMPTS.jsonl C [REPEATS]
"""

# ruff: noqa: E501 (report lines)
import gc
import itertools
import sys
import time

import numpy as np
import torch

import dspark.engine.engine as E
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
c = int(sys.argv[3])
repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 2
ids = [prompt_ids(target.tokenizer, p) for p in load_prompts(sys.argv[2], 4)]
reqs = list(itertools.islice(itertools.cycle(ids), max(c, 4)))
seq = max(512, max(map(len, reqs)) + 65)
chosen = {}  # the current step's plan: model rounds, probes, n-gram rounds
plan = PD.PayoffDrafting.plan


def recorded_plan(self, decoding, K):
    choices, lookups = plan(self, decoding, K)
    chosen.update(
        model=sum(c.proposer == "model" and not c.probe for c in choices),
        probe=sum(c.probe for c in choices),
        ngram=sum(c.proposer == "ngram" and not c.probe for c in choices),
    )
    return choices, lookups


PD.PayoffDrafting.plan = recorded_plan
steps = []  # (decoding requests, prefill step, ms, model rounds, probes, n-gram rounds)
engine_step = E.Engine.step


def recorded_step(self):
    chosen.clear()
    decoding = sum(self._uncached(r) == 0 for r in self._active)
    prefill = bool(self._queue) or any(self._uncached(r) for r in self._active)
    started = time.thread_time()
    events = engine_step(self)
    ms = 1e3 * (time.thread_time() - started)
    steps.append(
        (decoding, prefill, ms, chosen.get("model", 0), chosen.get("probe", 0), chosen.get("ngram", 0))
    )
    return events


E.Engine.step = recorded_step
params = SamplingParams(temperature=0.0, max_tokens=64)
for repeat in range(repeats):
    runs = {}
    for mode in ("plain", "payoff"):
        eng = Engine(
            target,
            drafter if mode == "payoff" else None,
            EngineConfig(block_size=7, policy="fixed", max_batch=c, max_seq_len=seq, payoff=mode == "payoff"),
        )
        eng.generate(reqs[:1], SamplingParams(temperature=0.0, max_tokens=4))
        gc.collect()
        steps.clear()
        started = time.process_time()
        eng.generate(reqs, params)
        runs[mode] = (time.process_time() - started, np.array(steps, dtype=float))
    print(f"repeat {repeat}: payoff {runs['plain'][0] / runs['payoff'][0]:.3f}x plain decoding", flush=True)
    for mode, (seconds, S) in runs.items():
        prefill, drafted = S[:, 1] > 0, S[:, 3:].sum(1) > 0
        print(
            f"  {mode:<6} {seconds:6.2f} s: {len(S)} steps, {prefill.sum():.0f} with prefill "
            f"({S[prefill, 2].sum() / 1e3:.2f} s, {100 * S[prefill, 2].sum() / S[:, 2].sum():.0f} %), "
            f"{(~prefill).sum():.0f} decoding only ({S[~prefill, 2].sum() / 1e3:.2f} s); "
            f"{drafted.sum():.0f} drafting ({(drafted & prefill).sum():.0f} with prefill, {S[drafted, 2].sum() / 1e3:.2f} s): "
            f"{S[:, 3].sum():.0f} model rounds, {S[:, 4].sum():.0f} probes, {S[:, 5].sum():.0f} n-gram rounds",
            flush=True,
        )
