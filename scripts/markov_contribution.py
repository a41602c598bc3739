"""How much does DSpark's Markov head contribute? Evaluate a DSpark drafter as trained and
with its transition bias switched off (W_2 = 0, i.e. its DFlash backbone alone), on the
same prompts with the same seeds, and print τ and conditional acceptance per position.

Usage: python scripts/markov_contribution.py [DRAFTER] [--limit N] [--max-tokens N] [--out DIR]
(DRAFTER: a shipped name or a folder; default: the shipped tiny DSpark drafter.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dspark.eval.benchmarks import load_benchmark
from dspark.eval.report import write_eval_report
from dspark.eval.runner import EvalConfig, run_eval
from dspark.formats.build import build_drafter
from dspark.presets.tiny import tiny_target_dir
from dspark.targets import TargetAdapter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drafter", nargs="?", default="dspark")
    ap.add_argument("--bench", default="math,code,chat")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=Path("runs/markov_contribution"))
    args = ap.parse_args()
    torch.set_num_threads(1)

    target = TargetAdapter.from_pretrained(tiny_target_dir())
    full = build_drafter(args.drafter, target)
    ablated = build_drafter(args.drafter, target)
    w2 = ablated.markov_head.markov_w2.weight  # [V, r]
    with torch.no_grad():
        w2.zero_()
    # Size of the learned transition bias B = W_1 W_2 against the scale of the base logits.
    bias = full.markov_head.markov_w1.weight @ full.markov_head.markov_w2.weight.T  # [V, V]
    stats = {
        "bias_abs_mean": float(bias.abs().mean()),
        "bias_row_std_mean": float(bias.std(dim=-1).mean()),
        "lm_head_row_norm_mean": float(target.model.get_output_embeddings().weight.norm(dim=-1).mean()),
    }
    benches = [load_benchmark(b, limit=args.limit) for b in args.bench.split(",")]
    config = EvalConfig(temperature=1.0, max_tokens=args.max_tokens, seed=0, baseline=False)
    result = run_eval(target, {"dspark": full, "dspark-no-markov": ablated}, benches, config)
    write_eval_report(result, args.out, {"target": "tiny", "drafters": {"dspark": args.drafter}})
    out = {"bias": stats, "rows": []}
    for row in result.domains:
        out["rows"].append(
            {
                "drafter": row.drafter,
                "domain": row.domain,
                "tau": round(row.tau, 3),
                "conditional_acceptance": [
                    None if v is None else round(v, 3) for v in row.conditional_acceptance
                ],
            }
        )
    (args.out / "markov_contribution.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
