"""Where a training step's time goes, per drafter, on the embedded tiny target (issue 16).

Times each stage of a micro-batch with one torch thread (default): collation, the target
forward (online features), the drafter's ``forward_train`` split into backbone / LM-head
logits / target logits, the loss (softmaxes, TV, soft labels, metrics), backward and the
optimizer step. Prints a Markdown table of milliseconds and shares per stage.

    python scripts/profile_train_step.py --drafters dflash,dspark,eagle3 --steps 6
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

import torch


@contextmanager
def timed(acc: dict[str, list[float]], name: str):
    start = time.perf_counter()
    yield
    acc[name].append((time.perf_counter() - start) * 1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafters", default="dflash,dspark,eagle3")
    ap.add_argument("--steps", type=int, default=6, help="micro-batches timed (after 1 warm-up)")
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--num-anchors", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from dspark.data.samples import collate, tokenize_records
    from dspark.drafters.kinds import KINDS
    from dspark.presets import drafters as presets
    from dspark.presets.tiny import resolve_target
    from dspark.targets import TargetAdapter
    from dspark.tiny.corpus import training_records
    from dspark.training import online

    for method in args.drafters.split(","):
        config = getattr(presets, f"{method}_tiny")()
        target = TargetAdapter.from_pretrained(resolve_target(None), target_layer_ids=config.target_layer_ids)
        torch.manual_seed(0)
        drafter = KINDS[method].drafter_cls.from_target(target, config).float().train()
        data = tokenize_records(training_records()[:200], target.tokenizer, max_length=args.max_length)
        opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4)
        acc: dict[str, list[float]] = defaultdict(list)
        tokens = 0
        for i in range(args.steps + 1):
            if i == 1:
                acc.clear()
                tokens = 0
            mb = args.micro_batch_size
            samples = [data[(i * mb + j) % len(data)] for j in range(mb)]
            with timed(acc, "total"):
                with timed(acc, "collate"):
                    tb = collate(samples, 0)
                with timed(acc, "target forward"):
                    batch = online.target_batch(
                        target,
                        tb.input_ids,
                        tb.loss_mask,
                        num_anchors=args.num_anchors,
                        generator=torch.Generator().manual_seed(i),
                        dtype=torch.float32,
                    )
                with timed(acc, "drafter forward_train"):
                    out = drafter.forward_train(batch)
                with timed(acc, "loss + metrics"):
                    loss = drafter.loss(out).loss
                with timed(acc, "backward"):
                    loss.backward()
                with timed(acc, "optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            tokens += sum(len(s.input_ids) for s in samples)
        total = statistics.mean(acc["total"])
        print(
            f"\n### {method} (micro-batch {args.micro_batch_size}, {args.num_anchors} anchors, "
            f"{args.threads} thread(s)): {tokens / sum(acc['total']) * 1000:.0f} tokens/s"
        )
        print("| stage | ms | share |\n|---|---:|---:|")
        for name, values in acc.items():
            m = statistics.mean(values)
            print(f"| {name} | {m:.1f} | {m / total:.0%} |")


if __name__ == "__main__":
    main()
