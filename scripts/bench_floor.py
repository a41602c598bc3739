"""Floor profile of issue 17: plain decoding vs a drafter attached whose rounds all decode plainly.

Thread CPU time of each engine part, the two variants alternating in one process (tiny
target, fp32, one thread). Mode ``override`` (default): the payoff controller decides, its
choices are then overridden to plain decoding (no probes); ``unprofitable``: fixed drafting
costs no round repays, so the controller itself decodes plainly and only probes;
``probes``: measured costs, the controller as shipped (``priced``: a probe waits until its
cost is ``probe_budget`` of plain decoding) against the probe clock alone (``clock``: every
probe costed 0, the controller before issue 17's probe pricing); ``values``:
``PayoffConfig.value_probes`` on (``valued``: a probe worth its cost is due with the probe
clock) against the controller as shipped, with it off (``priced``); ``realism``: the
controller as shipped (``realism``: first-draft rates scaled by the realised/expected
ratio of chosen rounds) against the same without that scaling (``naive``); ``explore``: the
controller as shipped (``explore``: pooled rates priced at their upper confidence bound,
aged while nobody observes them) against the pooled means, never aged (``greedy``), with
``fixed`` drafting beside them; ``lengths``: the controller as shipped (``lengths``: model
rounds verify as far as the bound on the request's later acceptance pays) against rounds
verifying as far as its mean pays (``short``), with ``fixed`` beside them; ``proposers``: the
controller as shipped (``both``: n-gram or model per request) against the model drafter
alone (``model``: ``choose_proposer=False``), with ``fixed`` beside them; ``drain``: the
controller as shipped (``drain``: accepted drafts valued by ``drain_value`` while the batch
drains) against every accepted draft valued at ``1/ρ`` (``rho``: ``drain_share_memory=0``),
with ``fixed`` beside them; ``quiet``: the controller as shipped (``reuse``: a plan in which
nobody drafts is reused for the next rounds, ``payoff_plan.hold_quiet``) against pricing every
round (``noreuse``), with the plans priced and reused counted.

    python scripts/bench_floor.py DRAFTER PROMPTS.jsonl[,...] 16,64 [REPEATS] [MODE]

Instrumentation by wrapping internals: a benchmark aid, not an API.
"""

# ruff: noqa: E501 (report lines)
import dataclasses
import itertools
import sys
import time

import numpy as np
import torch

import dspark.engine.draft_stage as DS
import dspark.engine.engine as E
import dspark.engine.payoff_drafting as PD
import dspark.engine.payoff_plan as PP
import dspark.engine.verify_stage as VS
from dspark.commands.loading import load_inference_target
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.drafters.registry import build_drafter
from dspark.engine import Engine, EngineConfig
from dspark.protocols import SamplingParams
from dspark.scheduler.payoff import Choice

torch.set_num_threads(1)
clk = time.thread_time
acc = {}


def timed(name, fn):
    def w(*a, **k):
        t = clk()
        r = fn(*a, **k)
        acc[name] = acc.get(name, 0.0) + clk() - t
        return r

    return w


NEVER = [False]
orig_plan = PD.PayoffDrafting.plan
UNPRICED = [False]
orig_probe_cost, orig_scalar_cost = PP.batch_probe_cost, PP.probe_cost


def probe_cost(net, *a, **k):
    return np.zeros(net.shape[0]) if UNPRICED[0] else orig_probe_cost(net, *a, **k)


def scalar_probe_cost(*a, **k):  # the per-request plan of small batches
    return 0.0 if UNPRICED[0] else orig_scalar_cost(*a, **k)


PP.batch_probe_cost, PP.probe_cost = probe_cost, scalar_probe_cost


def plan(self, decoding, K):
    t = clk()
    choices, lookups = orig_plan(self, decoding, K)
    acc["plan"] = acc.get("plan", 0.0) + clk() - t
    if NEVER[0]:
        choices = [Choice(None) for _ in choices]
        for r in decoding:
            r.shadow = r.shadow  # shadows stay as the controller set them
    return choices, lookups


PD.PayoffDrafting.plan = plan
E.flat_forward = timed("forward", E.flat_forward)
VS.VerifyStage.verify_and_commit = timed("verify+commit", VS.VerifyStage.verify_and_commit)
DS.DraftStage.draft = timed("draft stage", DS.DraftStage.draft)
DS.DraftStage.schedule = timed("schedule", DS.DraftStage.schedule)
E.Engine.step = timed("step", E.Engine.step)

target = load_inference_target(None, "float32")
drafter_name = sys.argv[1] if len(sys.argv) > 1 else "dspark"
drafter = build_drafter(drafter_name, target)
drafter.update = timed("drafter update", drafter.update)
sets = {s: load_prompts(s, 4) for s in sys.argv[2].split(",")}
conc = [int(c) for c in sys.argv[3].split(",")]
repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 3
MODE = (
    sys.argv[5] if len(sys.argv) > 5 else "override"
)  # or "unprofitable" (fixed prices nothing repays), "probes"
VARIANTS = {
    "probes": ("plain", "clock", "priced"),
    "values": ("plain", "priced", "valued"),
    "realism": ("plain", "naive", "realism"),
    "explore": ("plain", "fixed", "greedy", "explore"),
    "lengths": ("plain", "fixed", "short", "lengths"),
    "proposers": ("plain", "fixed", "both", "model"),
    "drain": ("plain", "fixed", "rho", "drain"),
    "quiet": ("plain", "noreuse", "reuse"),
}.get(MODE, ("plain", "never"))
hold_quiet = PP.hold_quiet
params = SamplingParams(temperature=0.0, max_tokens=64)
for (name, prompts), c in itertools.product(sets.items(), conc):
    ids = [prompt_ids(target.tokenizer, p) for p in prompts]
    reqs = list(itertools.islice(itertools.cycle(ids), max(c, 4)))
    seq = max(512, max(map(len, reqs)) + 65)
    tot = {}
    for _ in range(repeats):
        for variant in VARIANTS:
            costs = (
                (("model", 10.0), ("ngram", 10.0)) if MODE == "unprofitable" and variant != "plain" else None
            )
            cfg = EngineConfig(
                block_size=7,
                policy="fixed",
                max_batch=c,
                max_seq_len=seq,
                payoff=variant not in ("plain", "fixed"),
                choose_proposer=variant != "model",
                draft_costs=costs,
            )
            eng = Engine(target, drafter if variant != "plain" else None, cfg)
            if variant == "valued":
                eng.payoff.config = dataclasses.replace(eng.payoff.config, value_probes=True)
            if variant == "greedy":
                eng.payoff.config = dataclasses.replace(eng.payoff.config, explore=0.0, pool_aging=1.0)
            if variant == "short":
                eng.payoff.config = dataclasses.replace(eng.payoff.config, explore_lengths=False)
            if variant == "rho":
                eng.payoff.config = dataclasses.replace(eng.payoff.config, drain_share_memory=0.0)
            if variant == "naive":
                eng.payoff.config = dataclasses.replace(eng.payoff.config, realism_strength=0.0)
            PP.hold_quiet = (lambda *a: None) if variant == "noreuse" else hold_quiet
            NEVER[0] = variant == "never" and MODE == "override"
            UNPRICED[0] = variant == "clock"
            eng.generate(reqs[:1], SamplingParams(temperature=0.0, max_tokens=4))
            acc.clear()
            t = clk()
            res = eng.generate(reqs, params)
            acc["total"] = clk() - t
            acc["tokens"] = sum(len(r.token_ids) for r in res)
            acc["steps"] = eng.stats.steps
            acc["model rounds"], acc["model probes"] = eng.stats.model_rounds, eng.stats.model_probes
            acc["verified"], acc["accepted"] = eng.stats.verified, eng.stats.accepted
            acc["ngram rounds"] = eng.stats.ngram_rounds
            if eng.payoff is not None:
                acc["planned"], acc["reused"] = eng.payoff.planned, eng.payoff.reused
            d = tot.setdefault(variant, {})
            for k, v in acc.items():
                d[k] = d.get(k, 0.0) + v
    if MODE in ("probes", "values", "realism", "explore", "lengths", "proposers", "drain", "quiet"):
        p = tot["plain"]
        for v in VARIANTS[1:]:
            n = tot[v]
            print(
                f"== {name[-12:]} c={c} {v} {drafter_name}: {v}/plain speed {p['total'] / p['tokens'] / (n['total'] / n['tokens']):.3f}x "
                f"(plain {p['total']:.2f}s {v} {n['total']:.2f}s); model rounds {n['model rounds']:.0f} of which probes {n['model probes']:.0f}; "
                f"n-gram rounds {n['ngram rounds']:.0f}; verified {n['verified']:.0f} accepted {n['accepted']:.0f}; "
                f"draft stage {1e3 * n['draft stage'] / n['steps']:.2f} ms/step, drafter updates {n.get('drafter update', 0):.2f}s; "
                f"plans priced {n.get('planned', 0):.0f}, reused {n.get('reused', 0):.0f}"
            )
        continue
    p, n = tot["plain"], tot["never"]
    print(
        f"   plan per step: {1e3 * n['plan'] / n['steps']:.3f} ms; draft stage less plan {1e3 * (n['draft stage'] - n['plan']) / n['steps']:.3f} ms; verify+commit never-plain {1e3 * (n['verify+commit'] - p['verify+commit']) / n['steps']:.3f} ms/step"
    )
    print(
        f"== {name[-12:]} c={c} {MODE} {drafter_name}: never/plain speed {p['total'] / p['tokens'] / (n['total'] / n['tokens']):.3f}x "
        f"(plain {p['total']:.2f}s never {n['total']:.2f}s)"
    )
    po, no = p["step"] - p["forward"], n["step"] - n["forward"]
    print(
        f"   outside the forward: plain {po:.3f}s never {no:.3f}s -> floor {100 * (no - po) / p['total']:+.2f}% of plain "
        f"(plain {1e3 * po / p['steps']:.2f} ms/step, never {1e3 * no / n['steps']:.2f} ms/step over {p['steps']:.0f} steps)"
    )
    for k in sorted(set(p) | set(n)):
        if k in ("tokens", "steps"):
            continue
        print(
            f"   {k:<16} plain {p.get(k, 0):7.3f}s  never {n.get(k, 0):7.3f}s  diff {100 * (n.get(k, 0) - p.get(k, 0)) / p['total']:+6.2f}% of plain"
        )
