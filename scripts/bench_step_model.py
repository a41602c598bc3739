"""The step prices of payoff control: one line in rows against the plane in requests and extra rows (issue 17).

Per prompt set and concurrency, the same greedy requests decoded plainly, then by each drafter
under payoff control priced with the plane (``plane``: ``StepTimes.step_model`` as shipped, a
verified row priced apart from a decoding request's, and a step in which anybody verifies
paying its fixed part ``j``), with the plane's ``j`` left unpriced (``nojump``: ``j = 0``, so
no round is gated on it), with ``j`` at least 2 ms (``jfloor``: what a profiled prior of its
forward part would give where no step tells it apart), with the line in rows alone (``line``:
``step_model`` replaced by the line's ``(a, b, b, 0)``), and with ``fixed`` drafting, in turn,
``REPEATS`` times (``--modes=`` picks them; default ``line,plane,fixed``); speedups over plain
decoding per CPU-second of the process, and the share of rounds drafted. With
``--regression``, instead, the engine steps one payoff run per set observed, fitted four ways
by least squares (``1 rows``: the line; ``1 R extra``: the plane; with the drafting requests
or a drafting step's fixed part), the last also split into the step's parts (the forward,
verification and commit, the plan, the schedule), and the controller's own fit at the end of
each run.

    python scripts/bench_step_model.py DRAFTERS PROMPTS C[,C...] [REPEATS] [--regression] [--modes=plane,nojump]
"""

# ruff: noqa: E501 (report lines)
import gc
import itertools
import sys
import time

import numpy as np
import torch

import dspark.engine.draft_stage as DS
import dspark.engine.engine as E
import dspark.engine.payoff_drafting as PD
import dspark.engine.verify_stage as VS
import dspark.scheduler.step_times as ST
from dspark.commands.loading import load_inference_target
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.drafters.registry import build_drafter
from dspark.engine import Engine, EngineConfig
from dspark.protocols import SamplingParams

torch.set_num_threads(1)
args = [a for a in sys.argv[1:] if not a.startswith("--")]
REGRESSION = "--regression" in sys.argv
J_FLOOR = 0.002  # seconds: the ``jfloor`` mode's least j
MODES = next((a[8:] for a in sys.argv if a.startswith("--modes=")), "line,plane,fixed").split(",")
target = load_inference_target(None, "float32")
drafters = {n: build_drafter(n, target) for n in args[0].split(",")}
sets = args[1].split(",")
concurrencies = [int(c) for c in args[2].split(",")]
repeats = int(args[3]) if len(args) > 3 else 2
plane = ST.StepTimes.step_model


def line_model(self, R, K):
    a, b = self.fit(max(R, 1), max(R, 1) * (K + 1))
    return ST.StepModel(a, b, b, 0.0)


def nojump_model(self, R, K):
    return plane(self, R, K)._replace(j=0.0)


def jfloor_model(self, R, K):  # what a profiled prior of j's forward part would give
    model = plane(self, R, K)
    return model._replace(j=max(model.j, J_FLOOR))


def engine(drafter, c, seq, payoff):
    return Engine(
        target,
        drafter,
        EngineConfig(block_size=7, policy="fixed", max_batch=c, max_seq_len=seq, payoff=payoff),
    )


def requests(name, c):
    ids = [prompt_ids(target.tokenizer, p) for p in load_prompts(name, 4)]
    reqs = list(itertools.islice(itertools.cycle(ids), max(c, 4)))
    return reqs, max(512, max(map(len, reqs)) + 65)


def timed(part, fn, spent):
    def wrapper(*args, **kwargs):
        started = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[part] = spent.get(part, 0.0) + time.thread_time() - started

    return wrapper


PARTS = ("forward", "verify", "plan", "schedule")  # the parts of a step split by --regression


def regression():
    points, planned, spent, split = [], {}, {}, []
    plan, observe = PD.PayoffDrafting.plan, PD.PayoffDrafting.observe_step

    def recorded_plan(self, decoding, K):
        spent.clear()  # a step's parts start here (a step in prefill was not observed)
        choices, lookups = plan(self, decoding, K)
        planned.update(R=len(decoding), drafting=sum(c.proposer is not None for c in choices))
        return choices, lookups

    def recorded_observe(self, num_tokens, seconds, num_requests=None):
        if planned:
            points.append(
                (planned["R"], num_tokens, planned["drafting"], 1e3 * (seconds - self.model_step_s))
            )
            split.append([1e3 * spent.get(part, 0.0) for part in PARTS])
        planned.clear()
        spent.clear()
        return observe(self, num_tokens, seconds, num_requests)

    PD.PayoffDrafting.plan = timed("plan", recorded_plan, spent)
    PD.PayoffDrafting.observe_step = recorded_observe
    E.flat_forward = timed("forward", E.flat_forward, spent)
    VS.VerifyStage.verify_and_commit = timed("verify", VS.VerifyStage.verify_and_commit, spent)
    DS.DraftStage.schedule = timed("schedule", DS.DraftStage.schedule, spent)
    fitted = []  # the controller's own (a, c, b, j) at the end of each run, in ms
    for (name, c), drafter in itertools.product(itertools.product(sets, concurrencies), drafters.values()):
        reqs, seq = requests(name, c)
        eng = engine(drafter, c, seq, True)
        eng.generate(reqs[:1], SamplingParams(temperature=0.0, max_tokens=4))
        planned.clear()
        eng.generate(reqs, SamplingParams(temperature=0.0, max_tokens=64))
        fitted.append([1e3 * x for x in eng.payoff.step_times.step_model(c, 7)])
        print(f"  {name[-10:]:<10} c={c}: the controller's a c b j = {np.round(fitted[-1], 2)} ms")
    R, rows, drafting, ms = np.array(points, dtype=float).T
    extra, any_drafting, one = rows - R, (drafting > 0).astype(float), np.ones_like(R)
    print(f"{len(R)} steps, {int(any_drafting.sum())} drafting; ms per step =")
    for name, cols in (
        ("1 rows", (one, rows)),
        ("1 R extra", (one, R, extra)),
        ("1 R extra drafting", (one, R, extra, drafting)),
        ("1 R extra any", (one, R, extra, any_drafting)),
    ):
        X = np.stack(cols, 1)
        coef = np.linalg.lstsq(X, ms, rcond=None)[0]
        print(f"  {name:<20} {np.round(coef, 2)}  rms {np.sqrt(np.mean((X @ coef - ms) ** 2)):.2f} ms")
    X = np.stack((one, R, extra, any_drafting), 1)
    for part, y in zip(PARTS, np.array(split).T):  # each part's share of the same fit
        print(f"    {part:<18} {np.round(np.linalg.lstsq(X, y, rcond=None)[0], 2)}")


def compare():
    for name, c in itertools.product(sets, concurrencies):
        reqs, seq = requests(name, c)
        seconds, tokens, drafted, outputs = {}, {}, {}, {}
        variants = [("plain", None)] + [(f"{d} {m}", d) for d in drafters for m in MODES]
        models = {"line": line_model, "nojump": nojump_model, "jfloor": jfloor_model}
        for _ in range(repeats):
            for key, d in variants:
                mode = key.split()[-1]
                ST.StepTimes.step_model = models.get(mode, plane)
                eng = engine(drafters.get(d), c, seq, mode != "fixed")
                eng.generate(reqs[:1], SamplingParams(temperature=0.0, max_tokens=4))
                gc.collect()
                started = time.process_time()
                res = eng.generate(reqs, SamplingParams(temperature=0.0, max_tokens=64))
                seconds[key] = seconds.get(key, 0.0) + time.process_time() - started
                tokens[key] = tokens.get(key, 0) + sum(len(r.token_ids) for r in res)
                rounds = [rd for r in res for rd in r.rounds]
                drafted.setdefault(key, []).append(
                    sum(rd.proposed > 0 for rd in rounds) / max(len(rounds), 1)
                )
                outputs.setdefault(key, [r.token_ids for r in res])
        ST.StepTimes.step_model = plane
        base = tokens["plain"] / seconds["plain"]
        same = all(o == outputs["plain"] for o in outputs.values())
        for d in drafters:
            cells = "  ".join(
                f"{m} {tokens[f'{d} {m}'] / seconds[f'{d} {m}'] / base:.3f}x ({100 * np.mean(drafted[f'{d} {m}']):.0f} % drafted)"
                for m in MODES
            )
            print(f"{name[-10:]:<10} c={c:<3} {d:<7} {cells}  identical {same}", flush=True)


regression() if REGRESSION else compare()
