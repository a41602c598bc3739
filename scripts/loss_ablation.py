"""Is DSpark's slower start a matter of its loss? Train a 2-layer DSpark with the paper's
objective (0.1 CE + 0.9 TV + confidence BCE, Eq. 12) and with CE in place of TV (CE +
confidence BCE), and a 2-layer DFlash (CE), with the depth sweep's budget, then evaluate
them on the same prompts with the same seeds.

The variant "dspark 2L" is the depth sweep's run when ``--out`` holds a copy of it
(``runs/ablation_depth/runs/dspark_2L``): the sweep reuses finished runs.

Usage: python scripts/loss_ablation.py [--steps N] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from dspark.data.samples import tokenize_records
from dspark.drafters.objective import ObjectiveConfig
from dspark.eval.benchmarks import load_benchmark
from dspark.eval.report import write_eval_report
from dspark.eval.runner import EvalConfig
from dspark.eval.sweeps import SweepTraining, Variant, run_sweep
from dspark.presets import drafters as presets
from dspark.presets.tiny import tiny_target_dir
from dspark.targets import TargetAdapter
from dspark.tiny.corpus import training_records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", type=Path, default=Path("runs/ablation_loss"))
    args = ap.parse_args()
    torch.set_num_threads(1)

    target = TargetAdapter.from_pretrained(tiny_target_dir())
    dataset = tokenize_records(training_records(), target.tokenizer, max_length=256)
    dspark = dataclasses.replace(presets.dspark_tiny(), num_layers=2, block_size=7)
    ce_conf = ObjectiveConfig(ce=1.0, conf=1.0, decay=dspark.objective.decay)
    variants = [
        Variant("dspark 2L", "dspark", 2, dspark),
        Variant("dspark 2L CE", "dspark", 2, dataclasses.replace(dspark, objective=ce_conf)),
        Variant(
            "dflash 2L", "dflash", 2, dataclasses.replace(presets.dflash_tiny(), num_layers=2, block_size=7)
        ),
    ]
    training = SweepTraining(
        steps=args.steps, batch_size=8, micro_batch_size=4, lr=1e-3, num_anchors=64, seed=0, progress=False
    )
    benches = [load_benchmark(d, limit=10) for d in ("math", "code", "chat")]
    config = EvalConfig(temperature=1.0, max_tokens=64, seed=0, progress=False)
    sweep = run_sweep(
        "loss", target, variants, dataset, benches, args.out, training=training, eval_config=config
    )
    write_eval_report(sweep.eval, args.out / "eval", {"target": "tiny"})
    table = {}
    for row in sweep.eval.domains:
        table.setdefault(row.drafter, {})[row.domain] = round(row.tau, 3)
    (args.out / "loss_ablation.json").write_text(json.dumps(table, indent=1) + "\n")
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
