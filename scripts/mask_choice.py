"""Issue 11's mask-input measurement: a learned mask embedding vs an existing token, equal budget.

Trains two small DSpark drafters for a target whose tokenizer has no mask token
(default: SmolLM2-135M-Instruct) on the same samples with the same seed and steps, one
with ``mask_embedding=True`` and one with ``mask_token_id`` = an existing token, and
prints real τ (T = 1, γ = 7) of both on the same held-out prompts.

Usage: python scripts/mask_choice.py OUT_DIR [STEPS] [TOKEN]
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import torch

from dspark.data.samples import tokenize_records
from dspark.drafters.dspark import DSparkConfig
from dspark.eval.benchmarks import load_benchmark
from dspark.eval.runner import EvalConfig
from dspark.eval.sweeps import SweepTraining, Variant, run_sweep
from dspark.presets.tiny import resolve_target
from dspark.targets import TargetAdapter
from dspark.tiny.corpus import training_records


def main(out: Path, steps: int, token: str) -> None:
    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(1)
    target = TargetAdapter.from_pretrained(resolve_target("smollm2"))
    token_id = target.tokenizer.convert_tokens_to_ids(token)
    base = DSparkConfig(num_layers=1, block_size=7, markov_rank=64)
    variants = [
        Variant(
            "learned mask embedding", "dspark", 0, DSparkConfig(**{**vars(base), "mask_embedding": True})
        ),
        Variant(
            f"token {token} ({token_id})",
            "dspark",
            1,
            DSparkConfig(**{**vars(base), "mask_token_id": token_id}),
        ),
    ]
    records = training_records()[::78][:96]  # spread over the math, code and chat parts
    dataset = tokenize_records(records, target.tokenizer, max_length=192)
    benchmarks = [load_benchmark(d, limit=3) for d in ("math", "code", "chat")]
    training = SweepTraining(steps=steps, batch_size=4, micro_batch_size=2, num_anchors=24, lr=1e-3)
    sweep = run_sweep(
        "mask", target, variants, dataset, benchmarks, out, training=training,
        eval_config=EvalConfig(temperature=1.0, max_tokens=48, progress=False),
    )  # fmt: skip
    rows = {}
    for p in sweep.points:
        rows.setdefault(p.label, {})[p.benchmark] = round(p.tau, 3)
    for r in sweep.eval.rows:
        if r.drafter in rows:
            rows[r.drafter].setdefault("_rounds", 0)
            rows[r.drafter]["_rounds"] += r.num_rounds
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main(
        Path(sys.argv[1]),
        int(sys.argv[2]) if len(sys.argv) > 2 else 60,
        sys.argv[3] if len(sys.argv) > 3 else "<|endoftext|>",
    )
