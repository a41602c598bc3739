"""Training tokens/s per core: a baseline revision's trainer against this tree's, in one run (issue 16).

Both paths train the same drafter on the same samples with the same recipe (global batch
8, micro-batch 4, 64 anchors per sequence, ≤ 512 tokens, lr 1e-3), one torch thread each,
each tree's default precision (``precision="auto"``), in alternating subprocesses so that
machine noise hits both alike:

- ``old``: the baseline revision (default: the commit before issue 16), online target
  features, exactly as ``dspark train`` ran there (``--old-cache``: from the same offline
  cache, for a baseline that has one);
- ``new``: this tree, features from an offline cache built once (the campaign's path),
  with every speed-up of the current trainer.

The tiny target trains on its corpus; ``--target smollm2 --records answers.jsonl
--draft-vocab 8192`` on the campaign's regenerated answers with its reduced vocabulary.

Tokens/s counts real sequence tokens (no padding) of the timed steps (the first
``--warmup`` steps are not timed) per second of this process's CPU time — one thread, so
tokens per core-second, which other jobs on the machine disturb far less than wall time
(wall-clock tokens/s is printed too). Prints a Markdown table and the new/old ratios.

``--roofline`` also counts the floating-point work of the new path's warm-up steps
(``torch.profiler``: the matrix products of forward and backward, their FLOPs and their share
of the operator time) and times this core's best matrix product at the objective's shapes:
the new path's share of that peak, and the new/old ratio a step running entirely at peak
would reach — the ceiling of any speed-up that keeps the recipe's arithmetic.

    python scripts/bench_train_throughput.py --methods dflash,dspark,eagle3 --steps 12 --repeats 2
    python scripts/bench_train_throughput.py --methods dspark --steps 6 --repeats 1 --roofline
    A=~/.cache/dspark/campaigns/smollm2/data/answers.jsonl
    python scripts/bench_train_throughput.py --target smollm2 --records $A --draft-vocab 8192 \
        --max-length 768 --baseline 03e6143 --old-cache --methods dspark
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "5a49af0"  # main before issue 16's trainer work
ROOFLINE = ("flops_per_token", "product_share", "product_flops")  # a child's --roofline keys


def child(args: argparse.Namespace) -> None:
    """One timed training run in this process; prints ``{"tokens_per_s": ...}``."""
    import dataclasses
    import random

    import torch

    torch.set_num_threads(1)
    try:
        from dspark.data.samples import TrainDataset, tokenize_records
    except ImportError:  # the baseline revision kept them in training/
        from dspark.training.data import TrainDataset, tokenize_records
    from dspark.presets import drafters as presets
    from dspark.presets.tiny import resolve_target
    from dspark.targets import TargetAdapter
    from dspark.tiny.corpus import training_records
    from dspark.training.fresh import train_new_drafter
    from dspark.training.trainer import TrainConfig

    config = getattr(presets, f"{args.method}_{args.target}")()
    if args.draft_vocab:
        config = dataclasses.replace(config, draft_vocab_size=args.draft_vocab)
    target = TargetAdapter.from_pretrained(resolve_target(args.target))
    if args.records:
        with open(args.records) as f:
            records = [json.loads(line) for line in f if line.strip()]
    else:
        records = training_records()
    random.Random(0).shuffle(records)
    records = records[: args.samples]
    samples = tokenize_records(records, target.tokenizer, max_length=args.max_length)
    options = {}
    if args.path == "new" or args.old_cache:
        from dspark.data.cache import FeatureCache
        from dspark.data.cache_build import CacheBuildConfig, build_cache

        cache_dir = Path(args.cache)
        if not (cache_dir / "manifest.json").is_file():
            build_cache(
                target, records, cache_dir, CacheBuildConfig(max_length=args.max_length, progress=False)
            )
        cache = FeatureCache.open(cache_dir)
        samples = TrainDataset(cache.token_samples())
        options["feature_cache"] = cache
    from dspark.training import trainer as trainer_module

    timings: list[tuple[float, float, int]] = []  # (cpu s, wall s, tokens) per optimizer step
    # (product FLOPs, tokens, product µs, all ops' µs) of the warm-up steps, --roofline
    counted: list[tuple[int, int, float, float]] = []
    step = trainer_module.Trainer.step

    def timed_step(self, *a, **k):
        if args.roofline and len(timings) < args.warmup:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
                stats = step(self, *a, **k)
            ops = prof.key_averages()
            products = [e for e in ops if e.key in ("aten::mm", "aten::bmm", "aten::addmm")]
            counted.append(
                (
                    sum(e.flops for e in products),
                    stats.tokens,
                    sum(e.self_cpu_time_total for e in products),
                    sum(e.self_cpu_time_total for e in ops),
                )
            )
            timings.append((0.0, 0.0, 0))
            return stats
        cpu, wall = time.process_time(), time.perf_counter()
        stats = step(self, *a, **k)
        timings.append((time.process_time() - cpu, time.perf_counter() - wall, stats.tokens))
        return stats

    trainer_module.Trainer.step = timed_step
    bf16 = []  # the precision the tree's trainer resolved
    init = trainer_module.Trainer.__init__

    def recorded_init(self, *a, **k):
        init(self, *a, **k)
        bf16.append(bool(getattr(self, "use_bf16", False)))

    trainer_module.Trainer.__init__ = recorded_init
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(
            output_dir=out,
            max_steps=args.warmup + args.steps,
            global_batch_size=8,
            micro_batch_size=4,
            lr=1e-3,
            num_anchors=64,
            save_every=0,
            log_every=args.warmup + args.steps,
            progress=False,
        )
        train_new_drafter(cfg, target, config, samples, Path(out) / "drafter", **options)
    cpu, wall, tokens = (sum(x) for x in zip(*timings[args.warmup :]))
    result = {"cpu": tokens / cpu, "wall": tokens / wall, "bf16": any(bf16)}
    if counted:
        flops, tokens, product_us, total_us = (sum(x) for x in zip(*counted))
        result["flops_per_token"] = flops / tokens
        result["product_share"] = product_us / total_us  # of the profiled steps' operator time
        result["product_flops"] = flops / (product_us / 1e6)  # the products' own rate
    print(json.dumps(result))


def peak_flops(shapes: list[tuple[int, int, int]], repeats: int = 20) -> float:
    """This core's best fp32 rate (FLOP/s, one thread) over ``F.linear`` of ``(rows, in, out)``."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    best = 0.0
    for rows, d_in, d_out in shapes:
        x, w = torch.randn(rows, d_in), torch.randn(d_out, d_in)
        F.linear(x, w)
        for _ in range(repeats):
            start = time.perf_counter()
            F.linear(x, w)
            best = max(best, 2 * rows * d_in * d_out / (time.perf_counter() - start))
    return best


def run_child(tree: Path, method: str, path: str, ns: argparse.Namespace, cache: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--method", method, "--path", path]
    cmd += ["--steps", str(ns.steps), "--warmup", str(ns.warmup), "--samples", str(ns.samples)]
    cmd += ["--cache", str(cache), "--target", ns.target, "--max-length", str(ns.max_length)]
    cmd += ["--records", ns.records] if ns.records else []
    cmd += ["--draft-vocab", str(ns.draft_vocab)] if ns.draft_vocab else []
    cmd += ["--old-cache"] if ns.old_cache else []
    cmd += ["--roofline"] if ns.roofline and path == "new" else []
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
    if out.returncode:
        raise SystemExit(f"{path} {method} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="dflash,dspark,eagle3")
    ap.add_argument("--steps", type=int, default=12, help="timed optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--samples", type=int, default=400, help="samples (shuffled, seed 0)")
    ap.add_argument("--target", default="tiny", help="tiny | smollm2 (presets <method>_<target>)")
    ap.add_argument("--records", help="JSONL of chat records to train on (default: the tiny corpus)")
    ap.add_argument("--draft-vocab", type=int, help="the drafters' reduced vocabulary N")
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--old-cache", action="store_true", help="the old path reads the offline cache too")
    ap.add_argument("--repeats", type=int, default=2, help="old/new pairs per method")
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the old trainer")
    ap.add_argument(
        "--roofline",
        action="store_true",
        help="count the new path's FLOPs and compare its rate with this core's best product",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--method", help=argparse.SUPPRESS)
    ap.add_argument("--path", choices=["old", "new"], help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        return child(ns)

    with tempfile.TemporaryDirectory() as tmp:
        old_tree = Path(tmp) / "old"
        old_tree.mkdir()
        archive = subprocess.run(
            ["git", "archive", ns.baseline, "src"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive.stdout, check=True)
        cache = Path(tmp) / "cache"
        load = os.getloadavg()[0]
        started = time.time()
        print(f"baseline {ns.baseline}; load average {load:.2f} at start\n")
        print(
            "| drafter | old tokens/CPU-s | new tokens/CPU-s | new/old (CPU) | new/old (wall) | precision |"
        )
        print("|---|---:|---:|---:|---:|---|")
        rooflines: list[tuple[str, float, float, float, float, float]] = []
        for method in ns.methods.split(","):
            old, new = [], []
            for _ in range(ns.repeats):
                old.append(run_child(old_tree, method, "old", ns, cache))
                new.append(run_child(ROOT, method, "new", ns, cache))
            o, n = (statistics.median(r["cpu"] for r in runs) for runs in (old, new))
            ow, nw = (statistics.median(r["wall"] for r in runs) for runs in (old, new))
            precision = " / ".join("bf16" if runs[0]["bf16"] else "fp32" for runs in (old, new))
            print(
                f"| {method} | {o:.0f} | {n:.0f} | **{n / o:.2f}×** | {nw / ow:.2f}× | {precision} |",
                flush=True,
            )
            if ns.roofline:
                rooflines.append((method, o, n, *(statistics.median(r[k] for r in new) for k in ROOFLINE)))
        if rooflines:
            print_roofline(rooflines)
        print(f"\nload average {os.getloadavg()[0]:.2f} at end; {time.time() - started:.0f} s")


def print_roofline(rows: list[tuple[str, float, float, float, float, float]]) -> None:
    """The new path's share of the core's peak, and the new/old ceiling at that peak."""
    # the objective's products at the tiny preset's shapes: slots × hidden × vocab, the MLP
    peak = peak_flops([(1792, 256, 4096), (1792, 256, 768), (1792, 768, 256), (512, 256, 4096)])
    print(f"\nthis core's best fp32 product: {peak / 1e9:.0f} GFLOP/s (one thread)\n")
    print(
        "| drafter | MFLOP / token | step GFLOP/s | share of peak | products' share of the step "
        "| products GFLOP/s | tokens/CPU-s at peak | ceiling new/old |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for method, old, new, per_token, share, product_rate in rows:
        at_peak = peak / per_token
        print(
            f"| {method} | {per_token / 1e6:.1f} | {new * per_token / 1e9:.0f} | "
            f"{new * per_token / peak:.0%} | {share:.0%} | {product_rate / 1e9:.0f} | {at_peak:.0f} | "
            f"{at_peak / old:.2f}× |"
        )


if __name__ == "__main__":
    main()
