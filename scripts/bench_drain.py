"""What an accepted draft token is worth when a batch drains (issue 17).

``bench matrix`` submits ``c`` requests at once and times them to the last token: a drain.
Payoff control prices an accepted token at plain decoding's seconds per token at this
batch (``1/ρ = S(R)/R``), which is what it is worth while the batch stays full. In a
drain only the requests that finish last set the time, so a token accepted by a request
that is not among them saves only its own row of the remaining steps. Runs plain
decoding, payoff control and ``fixed`` drafting over the same requests (tiny target, fp32,
one thread, thread CPU time) and prints the steps each took, the accepted drafts, and the
seconds a step saved per accepted draft beside ``1/ρ``.

    python scripts/bench_drain.py DRAFTER PROMPTS C [REQUESTS] [REPEATS]
"""

# ruff: noqa: E501 (report lines)
import itertools
import sys
import time

import torch

import dspark.engine.engine as E
from dspark.commands.loading import load_inference_target
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.drafters.registry import build_drafter
from dspark.engine import Engine, EngineConfig
from dspark.protocols import SamplingParams

torch.set_num_threads(1)
clk = time.thread_time
acc: dict[str, float] = {}
forward = E.flat_forward


def timed_forward(*a, **k):
    t = clk()
    out = forward(*a, **k)
    acc["forward"] = acc.get("forward", 0.0) + clk() - t
    return out


E.flat_forward = timed_forward
target = load_inference_target(None, "float32")
drafter = build_drafter(sys.argv[1], target)
ids = [prompt_ids(target.tokenizer, p) for p in load_prompts(sys.argv[2], 16)]
C = int(sys.argv[3])
reqs = list(itertools.islice(itertools.cycle(ids), int(sys.argv[4]) if len(sys.argv) > 4 else C))
params = SamplingParams(temperature=0.0, max_tokens=64)
tot: dict[str, dict[str, float]] = {}
for _ in range(int(sys.argv[5]) if len(sys.argv) > 5 else 2):
    for variant in ("plain", "payoff", "fixed"):
        cfg = EngineConfig(
            block_size=7, policy="fixed", max_batch=C, max_seq_len=600, payoff=variant == "payoff"
        )
        eng = Engine(target, None if variant == "plain" else drafter, cfg)
        eng.generate(reqs[:1], SamplingParams(temperature=0.0, max_tokens=4))
        acc.clear()
        t = clk()
        res = eng.generate(reqs, params)
        acc["total"] = clk() - t
        acc["tokens"] = sum(len(r.token_ids) for r in res)
        s = eng.stats
        acc.update(
            steps=s.steps,
            verified=s.verified,
            accepted=s.accepted,
            ngram=s.ngram_rounds,
            model=s.model_rounds,
        )
        d = tot.setdefault(variant, {})
        for k, x in acc.items():
            d[k] = d.get(k, 0.0) + x
p = tot["plain"]
per_step, per_token = p["total"] / p["steps"], p["total"] / p["tokens"]
for variant, d in tot.items():
    line = (
        f"{variant:7} speed {p['total'] / p['tokens'] / (d['total'] / d['tokens']):.3f}x  steps {d['steps']:.0f}  "
        f"forward {1e3 * d['forward'] / d['steps']:.1f} ms/step  verified {d['verified']:.0f} accepted {d['accepted']:.0f} "
        f"(n-gram rounds {d['ngram']:.0f}, model rounds {d['model']:.0f})"
    )
    if d["accepted"]:
        saved = (p["steps"] - d["steps"]) * per_step / d["accepted"]
        line += f"; a plain step's seconds saved per accepted draft {1e3 * saved:.2f} ms, 1/ρ {1e3 * per_token:.2f} ms"
    print(line, flush=True)
