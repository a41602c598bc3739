"""Engine and scheduler figures for BENCHMARKS.md (issue 6): SPS profile, flat vs padded
verification layout, engine overhead per step. One thread; a random-init target of the
embedded tiny target's shape unless ``--target`` names a model folder.

    python scripts/bench_engine.py [--target PATH] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import torch
from transformers import Qwen3ForCausalLM

from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.decoding import speculative_generate
from dspark.drafters.ngram import NgramDrafter
from dspark.engine import Engine, EngineConfig
from dspark.engine.profile import profile_sps
from dspark.engine.step_costs import engine_overhead, flat_vs_padded, random_prompts
from dspark.presets.tiny import resolve_target
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter
from dspark.targets.flat import KVStore
from dspark.tiny.build import TinyTargetConfig, model_config


def tiny_shaped_target() -> TargetAdapter:
    """Random-init Qwen3 with the embedded tiny target's shape (12 layers, H 256, V 4096)."""

    class _Tok:  # model_config reads only these
        pad_token_id, eos_token_id = 0, 2

        def __len__(self) -> int:
            return TinyTargetConfig().vocab_size

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(model_config(TinyTargetConfig(), _Tok())).eval()
    target = TargetAdapter(model)
    target.eos_token_ids = ()  # random weights: run every request to max_tokens
    return target


def engine_vs_loop(target: TargetAdapter, prompts: list[list[int]], max_tokens: int) -> dict:
    """Greedy outputs and wall time: one engine batch vs the batch-1 loop, n-gram drafter."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    engine = Engine(target, NgramDrafter(target.vocab_size), EngineConfig(max_batch=len(prompts)))
    started = time.perf_counter()
    batched = engine.generate(prompts, params)
    engine_s = time.perf_counter() - started
    started = time.perf_counter()
    loop = [speculative_generate(target, NgramDrafter(target.vocab_size), p, params) for p in prompts]
    loop_s = time.perf_counter() - started
    return {
        "prompts": len(prompts),
        "engine_s": round(engine_s, 2),
        "loop_s": round(loop_s, 2),
        "identical": all(a.token_ids == b.token_ids for a, b in zip(batched, loop)),
        "tokens": sum(len(r.token_ids) for r in batched),
        "engine_tau": round(engine.stats.tau, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--target", default=None, help="model folder, hub id or 'tiny' (default: random tiny-shaped)"
    )
    p.add_argument("--prompts", default=None, help="prompt set (built-in name or JSONL) for a real target")
    p.add_argument("--out", default=None)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--vs-loop", action="store_true", help="only: engine vs batch-1 loop on built-in prompts")
    args = p.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    target = (
        TargetAdapter.from_pretrained(resolve_target(args.target)) if args.target else tiny_shaped_target()
    )
    if args.vs_loop:
        sets = ("math", "code", "chat")
        prompts = [prompt_ids(target.tokenizer, p) for d in sets for p in load_prompts(args.prompts or d, 4)]
        print(json.dumps(engine_vs_loop(target, prompts, args.max_tokens)))
        return
    target.eos_token_ids = ()  # every request runs to max_tokens: steady batches to measure
    out: dict = {"threads": torch.get_num_threads()}

    store = KVStore.for_target(target, num_slots=32, capacity=512)
    sps = profile_sps(target, store, block_size=7, repeats=5)
    out["sps"] = {b: round(s, 2) for b, s in zip(sps.tokens, sps.steps_per_s)}
    del store

    g = torch.Generator().manual_seed(1)
    spread = torch.randint(1, 9, (32,), generator=g).tolist()  # verification runs of 1..8 tokens
    out["layout"] = [flat_vs_padded(target, lengths).as_dict() for lengths in (spread, [8] * 32, [1] * 32)]

    if args.prompts:
        prompts = [prompt_ids(target.tokenizer, p) for p in load_prompts(args.prompts, 32)]
    else:
        prompts = random_prompts(target.vocab_size, 32, 96)
    rows = []
    ngram = NgramDrafter(target.vocab_size)
    configs = [(None, "fixed"), (ngram, "fixed"), (ngram, "prefix"), (ngram, "prefix-async")]
    for temperature in map(float, args.temperatures.split(",")):
        for batch in map(int, args.batches.split(",")):
            for drafter, policy in configs:
                report = engine_overhead(
                    target,
                    drafter,
                    prompts,
                    batch=batch,
                    policy=policy,
                    max_tokens=args.max_tokens,
                    temperature=temperature,
                    sps=sps,
                )
                rows.append(
                    {
                        "drafter": "ngram" if drafter else "none",
                        "temperature": temperature,
                        **report.as_dict(),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    out["overhead"] = rows
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
