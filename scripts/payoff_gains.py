"""What the payoff controller priced, against fixed drafting, on one cell (issue 17).

Runs the same greedy requests twice through the engine, tiny target, fp32, one thread:
under payoff control (logging each round's priced gain of the model drafter per request,
whether its shared call was blocked, and the costs and pooled rates it priced with), then
with the static ``fixed`` policy. Prints both runs' speed per CPU-second, rounds by proposer,
the distribution of the priced gains, the acceptance by round index (rounds counted
from the prompt), which is where a systematic miss shows, and the tokens each chosen model
round was expected to accept (``expected_accepted`` at the request's shrunk rates and the
chosen cap) against what it accepted: a biased acceptance model shows there.

    python scripts/payoff_gains.py dspark 16 /work/shared/benchmarks/gsm8k.jsonl

Instrumentation by wrapping internals: a benchmark aid, not an API.
"""

# ruff: noqa: E501 (report lines)
import itertools
import sys
import time

import numpy as np
import torch

import dspark.engine.payoff_drafting as PD
import dspark.engine.payoff_plan as PP
from dspark.commands.loading import load_inference_target
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.drafters.registry import build_drafter
from dspark.engine import Engine, EngineConfig
from dspark.protocols import SamplingParams
from dspark.scheduler.payoff import expected_accepted
from dspark.scheduler.payoff_batch import batch_rates

torch.set_num_threads(1)
name, c, prompt_set = sys.argv[1], int(sys.argv[2]), sys.argv[3]
target = load_inference_target(None, "float32")
drafter = build_drafter(name, target)
ids = [prompt_ids(target.tokenizer, p) for p in load_prompts(prompt_set, 4)]
reqs = list(itertools.islice(itertools.cycle(ids), max(c, 4)))  # as `bench matrix`: 4 requests at least
rounds_log, costs_log = [], []
expected: dict[tuple[int, int], float] = {}  # (request id, tokens generated) -> E(ℓ) of a model round
quiet_margin, costs, plan = PP.quiet_margin, PD.PayoffDrafting.costs, PD.PayoffDrafting.plan


def logged_margin(gains, **k):
    rounds_log.append(({n: g.copy() for n, g in gains.items()}, bool(k["blocked"])))
    return quiet_margin(gains, **k)


def logged_costs(self, R):
    out = costs(self, R)
    pooled = {n: tuple(round(float(x), 3) for x in r.rates(self.config)) for n, r in self.pooled.items()}
    costs_log.append((R, out, self.model_call_s(R) if "model" in self.pooled else 0.0, pooled))
    return out


def logged_plan(self, decoding, K):
    choices, lookups = plan(self, decoding, K)
    prior = self.pooled["model"].rates(self.config) if "model" in self.pooled else None
    for req, choice in zip(decoding, choices):
        if choice.proposer == "model":
            e, q = batch_rates([req.payoff.records.get("model")], self.config, prior)
            expected[req.id, len(req.generated)] = expected_accepted(float(e[0]), float(q[0]), choice.length)
    return choices, lookups


PP.quiet_margin, PD.PayoffDrafting.costs, PD.PayoffDrafting.plan = logged_margin, logged_costs, logged_plan
for payoff in (True, False):
    engine = Engine(
        target,
        drafter,
        EngineConfig(block_size=7, policy="fixed", max_batch=c, max_seq_len=600, payoff=payoff),
    )
    if payoff:  # every round through the batch plan, whose gains ``logged_margin`` sees (same decisions)
        engine.payoff.small_batch = 0
    engine.generate(reqs[:1], SamplingParams(temperature=0.0, max_tokens=4))
    rounds_log.clear(), costs_log.clear(), expected.clear()
    first_id = engine._next_id  # the requests' ids, in prompt order
    started = time.thread_time()
    results = engine.generate(reqs, SamplingParams(temperature=0.0, max_tokens=64))
    seconds = time.thread_time() - started
    s = engine.stats
    print(
        f"{'payoff' if payoff else 'fixed'}: {sum(len(r.token_ids) for r in results) / seconds:.1f} tokens/CPU-s, "
        f"{s.steps} steps; request-rounds by n-gram {s.ngram_rounds}, model {s.model_rounds} (probes {s.model_probes}); "
        f"accepted {s.accepted} of {s.verified} verified"
    )
    if payoff:
        realism = engine.payoff.realism
        strength = engine.payoff.config.realism_strength
        print(
            "  Realism (expected, accepted, factor) per proposer:",
            {
                k: (round(v.expected, 1), round(v.accepted, 1), round(v.factor(strength), 3))
                for k, v in realism.items()
            },
        )
    for proposer in ("model", "ngram") if payoff and rounds_log else ():
        if not any(proposer in g for g, _ in rounds_log):
            continue
        G = np.concatenate([g[proposer] for g, _ in rounds_log if proposer in g])
        G = G[np.isfinite(G)]
        print(
            f"  priced {proposer} gain per request-round: mean {G.mean():.3f} tokens, > 0 in {np.mean(G > 0):.0%}; deciles 1/5/9 {np.round(np.quantile(G, [0.1, 0.5, 0.9]), 3).tolist()}"
        )
    if payoff and rounds_log:
        print(f"  the model's shared call blocked in {np.mean([b for _, b in rounds_log]):.0%} of rounds")
        for R, priced, call_s, pooled in costs_log[:: max(len(costs_log) // 4, 1)]:
            print(
                f"  R={R}: verify +7 = {priced.verify_s[-1] * 1e3:.2f} ms, rho {priced.tokens_per_s:.0f} tokens/s, draft ms "
                f"{ {k: round(v * 1e3, 3) for k, v in priced.draft_s.items()} }, call {call_s * 1e3:.2f} ms, pooled (e, q) {pooled}"
            )
    pairs = []  # (expected, accepted) of each chosen model round
    for offset, r in enumerate(results):
        done = 0
        for rd in r.rounds:
            if (first_id + offset, done) in expected and rd.proposed:
                pairs.append((expected[first_id + offset, done], rd.accepted))
            done += rd.emitted
    if pairs:
        want, got = np.mean(pairs, axis=0)
        print(
            f"  model rounds: expected to accept {want:.2f} tokens, accepted {got:.2f} ({len(pairs)} rounds)"
        )
    by_round: dict[int, list[int]] = {}
    for r in results:
        for i, rd in enumerate(r.rounds):
            if rd.proposed:
                acc = by_round.setdefault(i, [0, 0])
                acc[0], acc[1] = acc[0] + 1, acc[1] + rd.accepted
    print(
        "  round index: request-rounds drafted, accepted per drafted round:",
        [(i, n, round(a / n, 2)) for i, (n, a) in sorted(by_round.items())[:8]],
    )
