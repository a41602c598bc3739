"""Reduced draft vocabularies on a real target (issue 16): drafting cost, training cost, τ, file size.

One process, the same data and budget for every N, full vocabulary as the baseline:

    PYTHONPATH=src python scripts/bench_draft_vocab.py \
        --target ~/.cache/dspark/targets/smollm2-135m-instruct \
        --data answers.jsonl --vocab 8192,16384,full --steps 40

The target's features of every micro-batch are computed once and shared by all runs, so
the training figure is the drafter's own step (forward, loss against the target over
its draft vocabulary, backward, AdamW) in sequence tokens per second; expected τ is
``1 + Σ_k Π_{i≤k} α_i`` from the per-position acceptance ``Σ_D min(p_d, q)`` on held-out
samples (never trained on); drafting cost is the median wall time of one ``propose``
(batch 1, γ slots, T = 1) on held-out contexts; size is the drafter folder's weights in
bf16, written the way ``dspark train`` publishes them (the target's tensors left out).
Prints one JSON object; ratios are against the full vocabulary measured in this process.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dspark.commands.loading import load_target, training_records
from dspark.data.samples import collate, tokenize_records
from dspark.drafters.draft_vocab import choose_draft_ids, with_draft_vocab
from dspark.drafters.kinds import kind_of_config
from dspark.drafters.objective import acceptance_metrics, compute_loss
from dspark.formats.folder import WEIGHTS_NAME, save_drafter
from dspark.presets import drafters as presets
from dspark.protocols import SamplingParams, SequenceState
from dspark.training.online import target_batch
from dspark.training.run_identity import pad_id

log = logging.getLogger("bench_draft_vocab")


def _batches(target, samples, micro: int, anchors: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(0, len(samples) - micro + 1, micro):
        tb = collate(samples[i : i + micro], pad_id(target))
        out.append((target_batch(target, tb.input_ids, tb.loss_mask, num_anchors=anchors, generator=g), tb))
    return out


def _expected_tau(drafter, batches) -> float:
    """Expected τ over every held-out slot at once (per-position acceptance pooled, then the product)."""
    accepts = []
    with torch.no_grad():
        for batch, _ in batches:
            out = drafter.forward_train(batch)
            loss = compute_loss(out, drafter.config.objective)
            K = out.labels.shape[-1]
            accepts.append((loss.metrics.acceptance.nan_to_num(0.0), out.valid.reshape(-1, K).sum(0)))
    num = sum(a * n for a, n in accepts)
    den = sum(n for _, n in accepts)
    per_pos = (num / den.clamp_min(1)).view(1, 1, -1)
    return acceptance_metrics(per_pos, torch.ones_like(per_pos, dtype=torch.bool)).expected_tau


def _draft_ms(drafter, target, contexts, repeats: int) -> float:
    params = [SamplingParams(temperature=1.0, seed=0)]
    times, cpu = [], []
    with torch.no_grad():
        for ids in contexts:
            state = SequenceState(request_id=0, token_ids=list(ids), prompt_len=len(ids))
            state.features = target.forward(torch.tensor([ids[:-1]]), target.new_cache()).features[0]
            drafter.propose([state], drafter.block_size, params)  # builds the context cache
            for _ in range(repeats):
                start, start_cpu = time.perf_counter(), time.process_time()
                drafter.propose([state], drafter.block_size, params)
                times.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
    return 1000 * statistics.median(times), 1000 * statistics.median(cpu)


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    target = load_target(args.target)
    records = list(training_records([args.data], args.limit))
    samples = list(tokenize_records(records, target.tokenizer, max_length=args.max_length))
    held, train = samples[: args.held_out], samples[args.held_out :]
    log.info("%d training, %d held-out samples", len(train), len(held))
    # the target's features of every micro-batch the budget reaches, once for every N
    train_batches = _batches(
        target, train[: args.steps * args.micro_batch], args.micro_batch, args.anchors, 0
    )
    held_batches = _batches(target, held, 1, args.anchors, 1)
    contexts = [
        s.input_ids[: int(s.loss_mask.nonzero()[0]) + 8].tolist() for s in held[: args.draft_contexts]
    ]
    base = getattr(presets, args.preset)()
    results = []
    for spec in args.vocab.split(","):
        n = None if spec == "full" else int(spec)
        config = with_draft_vocab(base, n)
        torch.manual_seed(0)
        ids = choose_draft_ids(config, train, target.vocab_size)
        drafter = kind_of_config(config).drafter_cls.from_target(target, config, draft_ids=ids)
        params = [p for p in drafter.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
        drafter.train()
        tokens, seconds, cpu_seconds, step = 0, 0.0, 0.0, 0
        while step < args.steps:
            batch, tb = train_batches[step % len(train_batches)]
            start, start_cpu = time.perf_counter(), time.process_time()
            loss = drafter.loss(drafter.forward_train(batch)).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            seconds += time.perf_counter() - start
            cpu_seconds += time.process_time() - start_cpu
            tokens += tb.num_tokens
            step += 1
        drafter.eval()
        tau = _expected_tau(drafter, held_batches)
        draft_ms, draft_cpu_ms = _draft_ms(drafter, target, contexts, args.repeats)
        with tempfile.TemporaryDirectory() as tmp:
            folder = save_drafter(Path(tmp) / "d", drafter, target, dtype=torch.bfloat16)
            size = (folder / WEIGHTS_NAME).stat().st_size
            full = save_drafter(Path(tmp) / "f", drafter, target, dtype=torch.bfloat16, keep_shared=True)
            size_with_target = (full / WEIGHTS_NAME).stat().st_size
        row = {
            "draft_vocab": n or target.vocab_size,
            "coverage_train": _coverage(train, ids) if ids is not None else 1.0,
            "coverage_held_out": _coverage(held, ids) if ids is not None else 1.0,
            "train_tokens_per_s": tokens / seconds,
            "train_tokens_per_cpu_s": tokens / cpu_seconds,
            "expected_tau": tau,
            "draft_ms_per_block": draft_ms,
            "draft_cpu_ms_per_block": draft_cpu_ms,
            "file_mb_bf16": size / 1e6,
            "file_mb_bf16_with_target_tensors": size_with_target / 1e6,
        }
        log.info("%s", row)
        results.append(row)
    ref = results[-1]
    for r in results:
        r["train_speed_vs_full"] = r["train_tokens_per_s"] / ref["train_tokens_per_s"]
        r["train_speed_per_cpu_s_vs_full"] = r["train_tokens_per_cpu_s"] / ref["train_tokens_per_cpu_s"]
        r["draft_cost_vs_full"] = r["draft_ms_per_block"] / ref["draft_ms_per_block"]
        r["draft_cpu_cost_vs_full"] = r["draft_cpu_ms_per_block"] / ref["draft_cpu_ms_per_block"]
    return {
        "target": str(args.target),
        "preset": args.preset,
        "steps": args.steps,
        "micro_batch": args.micro_batch,
        "train_samples": len(train),
        "held_out": len(held),
        "rows": results,
    }


def _coverage(samples, ids) -> float:
    """Fraction of the supervised tokens of ``samples`` inside the draft vocabulary."""
    inside = total = 0
    for s in samples:
        labels = s.input_ids[s.loss_mask]
        inside += int(torch.isin(labels, ids).sum())
        total += labels.numel()
    return inside / max(total, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--data", required=True, help="regenerated JSONL (dspark data regenerate)")
    p.add_argument("--preset", default="dspark_smollm2")
    p.add_argument("--vocab", default="8192,16384,full", help="comma-separated N; the last is the baseline")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--limit", type=int, default=None, help="first N records of --data")
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--anchors", type=int, default=32)
    p.add_argument("--max-length", type=int, default=384)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--held-out", type=int, default=16)
    p.add_argument("--draft-contexts", type=int, default=4)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
