"""Issue 17: a batch-1 engine step split in parts, and our plain decoding vs HF generate, in one process.

Runs against whatever ``dspark`` is on PYTHONPATH, so the same script times the code before
a change (``git archive <commit> src | tar -x -C /tmp/before``; ``PYTHONPATH=/tmp/before/src``)
and after it. ``drafter.update`` is timed by wrapping it, so old code is split the same way.

    PYTHONPATH=src python scripts/bench_round_split.py tiny float32 48

Prints one JSON line: ms per engine step of the target forward, propose, update and the
rest (bookkeeping), and plain-decoding speed over HF generate (same prompts, interleaved).
Greedy, batch 1, the ``fixed`` policy, the shipped DSpark drafter, 3 built-in math prompts.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import dspark
from dspark.commands.loading import load_target
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.decoding import speculative_generate
from dspark.drafters.registry import build_drafter
from dspark.engine import Engine, EngineConfig
from dspark.eval.decode_speed import _hf_generate
from dspark.protocols import SamplingParams


def main(spec: str, dtype_name: str, max_tokens: int) -> dict:
    target = load_target(None if spec == "tiny" else spec, dtype=getattr(torch, dtype_name))
    drafter = build_drafter("dspark", target)
    prompts = [prompt_ids(target.tokenizer, p) for p in load_prompts("math", 3)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    update_s = [0.0]
    update = drafter.update

    def timed_update(*args, **kwargs):
        started = time.perf_counter()
        update(*args, **kwargs)
        update_s[0] += time.perf_counter() - started

    drafter.update = timed_update
    config = EngineConfig(block_size=7, policy="fixed", max_batch=1, max_seq_len=1024)
    engine = Engine(target, drafter, config)
    engine.generate([prompts[0][:8]], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    engine.stats, update_s[0] = type(engine.stats)(), 0.0
    for p in prompts:
        engine.generate([p], params)
    s, n = engine.stats, engine.stats.steps
    own_update = getattr(s, "update_s", 0.0)  # the engine's own timer (after issue 17) is inside step_s
    out = {
        "src": dspark.__file__,
        "dtype": dtype_name,
        "steps": n,
        "forward_ms": 1e3 * s.forward_s / n,
        "draft_ms": 1e3 * s.draft_s / n,
        "update_ms": 1e3 * update_s[0] / n,
        "bookkeeping_ms": 1e3 * (s.step_s - s.forward_s - s.draft_s - update_s[0]) / n,
    }
    # the engine's timer (0 before it existed) holds the wrapped call, so it reads at least as much
    assert own_update == 0.0 or own_update >= update_s[0] - 1e-9, (own_update, update_s[0])
    ours = hf = 0.0
    for _ in range(2):
        for p in prompts:
            started = time.perf_counter()
            plain = speculative_generate(target, None, p, params).token_ids
            ours += time.perf_counter() - started
            started = time.perf_counter()
            reference = _hf_generate(target, p, max_tokens)
            hf += time.perf_counter() - started
            assert plain == reference[: len(plain)], "plain decoding differs from HF generate"
    out["plain_over_hf_speed"] = hf / ours
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)
    with torch.no_grad():
        result = main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 48)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))
