"""Training tokens per CPU-second with online target features: dense vs chunked objective vs
chunked + target-side packing, in one process (issue 14).

A DSpark drafter (the target's ``dspark_<target>`` preset) trains on tiny-corpus samples
(shuffled, ≤ 512 tokens, so a micro-batch mixes lengths) with online target features:
global batch 8, micro-batch 4, 64 anchors. Three trainers start from the same weights and
data order and take turns, ``--steps`` optimizer steps each per turn, ``--repeats`` turns
(the first step of each trainer is a warm-up and is not timed), so machine noise hits
all three alike:

- ``dense``: the loss on materialized ``[1, N, K, V]`` logits (the path before issue 14);
- ``chunked``: the chunked objective (the default);
- ``packed``: chunked, and the micro-batch's samples run through the target as one
  flattened sequence (``TrainConfig.pack_target``): no target work on padding.

Tokens are real sequence tokens; time is this process's CPU time (one thread), so the
figures are tokens per core-second. Prints a Markdown table and ratios against ``dense``.

    python scripts/bench_train_packing.py --target tiny --steps 3 --repeats 2
    python scripts/bench_train_packing.py --target smollm2 --steps 2 --repeats 1
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch

MODES = ("dense", "chunked", "packed")


def densify(drafter) -> None:
    """Make ``drafter``'s training outputs dense: the loss then takes the materialized logits."""
    forward = drafter.forward_train

    def dense_forward(batch):
        out = forward(batch)
        _ = out.logits, out.target_logits  # materialize both [1, N, K, V] tensors
        return out

    drafter.forward_train = dense_forward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="tiny", choices=["tiny", "smollm2"])
    ap.add_argument("--steps", type=int, default=3, help="timed optimizer steps per trainer per turn")
    ap.add_argument("--repeats", type=int, default=2, help="turns")
    ap.add_argument("--samples", type=int, default=200)
    ns = ap.parse_args()
    torch.set_num_threads(1)

    from dspark.training import distributed
    from dspark.data.samples import TrainDataset, tokenize_records
    from dspark.drafters.dspark import DSparkDrafter
    from dspark.presets import drafters as presets
    from dspark.presets.tiny import resolve_target
    from dspark.targets import TargetAdapter
    from dspark.tiny.corpus import training_records
    from dspark.training.trainer import TrainConfig, Trainer

    target = TargetAdapter.from_pretrained(resolve_target(ns.target), device="cpu")
    records = training_records()
    random.Random(0).shuffle(records)
    dataset = TrainDataset(tokenize_records(records[: ns.samples], target.tokenizer, max_length=512))
    config = getattr(presets, f"dspark_{ns.target}")()
    world = distributed.current_world("cpu")
    trainers, times, tokens = {}, dict.fromkeys(MODES, 0.0), dict.fromkeys(MODES, 0)
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            torch.manual_seed(0)
            drafter = DSparkDrafter.from_target(target, config)
            if mode == "dense":
                densify(drafter)
            cfg = TrainConfig(
                output_dir=f"{tmp}/{mode}",
                max_steps=1 + ns.steps * ns.repeats,
                global_batch_size=8,
                micro_batch_size=4,
                num_anchors=64,
                lr=1e-3,
                progress=False,
                pack_target=mode == "packed",
            )
            trainers[mode] = Trainer(cfg, target, drafter, dataset, world)
            trainers[mode].step(1)  # warm-up
        losses = {}
        started = time.time()
        for turn in range(ns.repeats):
            for mode, trainer in trainers.items():
                cpu = time.process_time()
                for i in range(ns.steps):
                    stats = trainer.step(2 + turn * ns.steps + i)
                    tokens[mode] += stats.tokens
                times[mode] += time.process_time() - cpu
                losses[mode] = stats.loss
    rate = {m: tokens[m] / times[m] for m in MODES}
    print(
        f"target {ns.target}; {ns.steps} steps x {ns.repeats} turns per mode; {time.time() - started:.0f} s\n"
    )
    print("| mode | tokens / CPU-s | vs dense | last loss |")
    print("|---|---:|---:|---:|")
    for m in MODES:
        print(f"| {m} | {rate[m]:.0f} | {rate[m] / rate['dense']:.2f}× | {losses[m]:.4f} |")


if __name__ == "__main__":
    main()
