"""``dspark bench decode|matrix|target|markov-overhead|round|serve``: the measuring commands.

Each prints ratios against a baseline run in the same process (the machine is noisy);
the measuring itself lives in :mod:`dspark.eval.decode_speed`, :mod:`dspark.eval.target_report`,
:mod:`dspark.eval.overhead`, :mod:`dspark.eval.speed_matrix` and :mod:`dspark.server.load`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys

from dspark.commands.argtypes import int_list, non_negative_float, positive_int
from dspark.commands.options import (
    add_block_size,
    add_drafter,
    add_drafters,
    add_dtype,
    add_payoff,
    add_target,
)
from dspark.errors import DsparkError


def add_bench_decode_args(p: argparse.ArgumentParser) -> None:
    add_target(p)
    add_dtype(p)
    p.add_argument(
        "--bench",
        default="code",
        help="comma-separated prompt sets: built-in names (math, code, chat), shipped benchmark subsets "
        "(gsm8k, humaneval, mt-bench: 20 prompts each) or JSONL paths",
    )
    p.add_argument("--limit", type=positive_int, default=20, help="prompts per set")
    add_drafters(p, default="none,ngram")
    p.add_argument("--max-tokens", type=positive_int, default=128, help="tokens per answer")
    add_block_size(p, help="most drafts per round (γ)")
    p.add_argument("--no-hf", action="store_true", help="skip Hugging Face generate")
    p.add_argument(
        "--hf-prompt-lookup",
        type=int,
        default=0,
        help="also run HF generate with prompt_lookup_num_tokens=N (0: off)",
    )
    p.add_argument(
        "--hf-assistant",
        default=None,
        help="also run HF assisted generation with this assistant model folder (same tokenizer)",
    )
    p.add_argument(
        "--engine-policies",
        default="",
        help="also decode each drafter through the batched engine (one slot) with these comma-separated "
        "verification policies, as methods DRAFTER@POLICY (e.g. prefix,fixed)",
    )
    add_payoff(p)
    p.add_argument(
        "--temperature", type=non_negative_float, default=0.0, help="0 = greedy (default); > 0 samples"
    )
    p.add_argument("--verify-k", default="8", help="comma-separated k for the verify-k / decode-1 cost ratio")
    p.add_argument(
        "--strict",
        action="store_true",
        help="a prompt that does not fit the context is an error (default: skipped)",
    )
    p.add_argument("--json", action="store_true", help="print JSON rows instead of a table")


def main_bench_decode(args: argparse.Namespace) -> int:
    """Batch-1 greedy tokens/s of HF generate vs our loop with each drafter, as ratios from one run."""
    from dspark import conditions as run_conditions
    from dspark.commands.loading import load_inference_target, load_target
    from dspark.data.prompts import load_prompts
    from dspark.drafters.registry import build_drafter
    from dspark.eval.decode_speed import batch1_engine, bench_decode, verify_cost_ratio

    # Every prompt set is read (and a bad one refused) before anything is decoded.
    prompt_sets = {bench: load_prompts(bench, args.limit) for bench in args.bench.split(",")}
    target = load_inference_target(args.target, args.dtype)
    conditions = run_conditions.for_target(target)
    drafters = {name: build_drafter(name, target) for name in args.drafters.split(",")}
    policies = [p.strip() for p in args.engine_policies.split(",") if p.strip()]
    engines = {
        f"{name}@{policy}": batch1_engine(
            target,
            drafter,
            policy,
            block_size=args.block_size,
            payoff=not args.no_payoff_control,
            choose_proposer=not args.no_proposer_choice,
        )
        for name, drafter in drafters.items()
        if drafter is not None
        for policy in policies
    }
    assistant = None
    if args.hf_assistant:
        assistant = load_target(args.hf_assistant, dtype=target.dtype).model
    out = []
    for bench, prompts in prompt_sets.items():
        result = bench_decode(
            target,
            prompts,
            drafters,
            max_tokens=args.max_tokens,
            block_size=args.block_size,
            include_hf=not args.no_hf,
            hf_prompt_lookup=args.hf_prompt_lookup,
            hf_assistant=assistant,
            engines=engines,
            temperature=args.temperature,
            strict=args.strict,
        )
        if result.skipped:
            logging.getLogger("dspark").warning(
                "%s: skipped %d prompts that do not fit", bench, result.skipped
            )
        out += [{"bench": bench, "skipped": result.skipped, **row} for row in result.rows()]
    ratios = {int(k): verify_cost_ratio(target, k=int(k)) for k in args.verify_k.split(",")}
    conditions = conditions.ended()
    if args.json:
        print(
            json.dumps(
                {"rows": out, "verify_k_over_decode1": ratios, "conditions": conditions.as_dict()}, indent=2
            )
        )
    else:
        print(f"{'bench':<24}{'method':<18}{'tok/s':>9}{'tau':>7}{'speedup':>9}  identical")
        for r in out:
            print(
                f"{r['bench'][-24:]:<24}{r['method']:<18}{r['tokens_per_s']:>9.1f}{r['tau']:>7.2f}"
                f"{r['speedup']:>9.3f}  {r['identical_to_baseline']}"
            )
        for k, ratio in ratios.items():
            print(f"verify {k} tokens / decode 1 token: {ratio:.2f}x")
        print(f"run conditions: {conditions.describe()}")
    if conditions.warning():
        print(f"warning: {conditions.warning()}", file=sys.stderr)
    return 0


def add_bench_matrix_args(p: argparse.ArgumentParser) -> None:
    add_target(p)
    add_dtype(p)
    p.add_argument(
        "--prompts",
        default="code,math,chat",
        help="comma-separated prompt sets: built-in names (math, code, chat), shipped benchmark subsets "
        "(gsm8k, humaneval, mt-bench) or JSONL paths",
    )
    p.add_argument(
        "--limit", type=positive_int, default=4, help="prompts per set (cycled up to the concurrency)"
    )
    add_drafters(p, default="ngram,dspark,dflash,eagle3")
    p.add_argument(
        "--concurrency",
        type=int_list,
        default=[1, 4, 16, 64],
        help="comma-separated KV slots = requests at once",
    )
    p.add_argument(
        "--requests", type=positive_int, default=4, help="requests per cell at least (at low concurrency)"
    )
    p.add_argument("--max-tokens", type=positive_int, default=32, help="tokens per answer")
    add_block_size(p)
    p.add_argument(
        "--static",
        default="fixed",
        help="comma-separated static policies (every round drafts, no payoff control) to compare with",
    )
    p.add_argument("--json", action="store_true", help="print the cells and the goal check as JSON")


def main_bench_matrix(args: argparse.Namespace) -> int:
    """Prompt set x drafter x concurrency -> speedup over plain decoding: payoff control vs static."""
    from dspark import conditions as run_conditions
    from dspark.commands.loading import load_inference_target
    from dspark.data.chat import prompt_ids
    from dspark.data.prompts import load_prompts
    from dspark.drafters.registry import build_drafter
    from dspark.eval.speed_matrix import PAYOFF, goals, speed_matrix

    concurrencies = sorted(set(args.concurrency))
    static = [p.strip() for p in args.static.split(",") if p.strip()]
    sets = {spec.strip(): load_prompts(spec.strip(), args.limit) for spec in args.prompts.split(",")}
    target = load_inference_target(args.target, args.dtype)
    ids = {name: [prompt_ids(target.tokenizer, p) for p in prompts] for name, prompts in sets.items()}
    drafters = {name: build_drafter(name, target) for name in args.drafters.split(",")}
    if any(d is None for d in drafters.values()):
        raise DsparkError("--drafters: 'none' is the baseline every cell is measured against; leave it out")
    conditions = run_conditions.for_target(target)

    def show(cell) -> None:
        print(
            f"{cell.prompt_set[-20:]:<20} {cell.drafter:<8} c={cell.concurrency:<3} {cell.method:<8} "
            f"{cell.speedup:6.3f}x (wall {cell.wall_speedup:.3f}x)  τ {cell.tau:.2f}  "
            f"drafted {cell.drafted_share:.0%}  "
            f"identical {cell.identical}",
            file=sys.stderr,
            flush=True,
        )

    cells = speed_matrix(
        target,
        ids,
        drafters,
        concurrencies,
        max_tokens=args.max_tokens,
        requests=args.requests,
        block_size=args.block_size,
        static=static,
        progress=show,
    )
    check = goals(cells)
    conditions = conditions.ended()
    if args.json:
        payload = {"cells": [vars(c) for c in cells], "goals": check, "conditions": conditions.as_dict()}
        print(json.dumps(payload, indent=1, default=str))
    else:
        by = {(c.prompt_set, c.drafter, c.concurrency, c.method): c for c in cells}
        head = "".join(f"{f'c={c}':>16}" for c in concurrencies)
        print("speedup over plain decoding, tokens per CPU-second; in brackets the best static policy")
        print(f"{'prompt set':<22}{'drafter':<9}{head}")
        for name, drafter in itertools.product(ids, drafters):
            row = ""
            for c in concurrencies:
                best = max(by[(name, drafter, c, m)].speedup for m in static) if static else float("nan")
                row += f"{by[(name, drafter, c, PAYOFF)].speedup:>9.2f} ({best:.2f})"
            print(f"{name[-21:]:<22}{drafter:<9}{row}")
        print(
            f"payoff cells: {check['cells']}, min {check['min_speedup']:.3f}x plain; "
            f"below 0.97x: {len(check['below_floor'])}; below 95% of the best static where it pays: "
            f"{len(check['below_95pct_of_best_static'])}; greedy identical everywhere: "
            f"{check['all_identical']}"
        )
        print(f"run conditions: {conditions.describe()}")
    if conditions.warning():
        print(f"warning: {conditions.warning()}", file=sys.stderr)
    return 0


def add_bench_target_args(p: argparse.ArgumentParser) -> None:
    add_target(p)
    add_dtype(p)
    p.add_argument("--limit", type=positive_int, default=40, help="prompts per built-in domain")
    p.add_argument("--max-tokens", type=positive_int, default=384, help="tokens per answer")
    p.add_argument("--samples", type=int, default=3, help="sample answers to print per domain")


def main_bench_target(args: argparse.Namespace) -> int:
    """How structured the target's greedy answers are on the built-in math/code/chat prompts."""
    from dspark.commands.loading import load_inference_target
    from dspark.eval.target_report import target_report

    target = load_inference_target(args.target, args.dtype)
    reports = target_report(target, limit=args.limit, max_tokens=args.max_tokens, samples=args.samples)
    print(json.dumps([r.as_dict() for r in reports], indent=2))
    for r in reports:
        for prompt, answer in r.samples:
            print(f"\n### {r.domain}\n**Prompt:** {prompt}\n\n**Answer:**\n{answer}")
    return 0


def add_bench_overhead_args(p: argparse.ArgumentParser) -> None:
    add_target(p)
    add_dtype(p)
    add_drafter(p, default="dspark", purpose="a drafter with a sequential (Markov/RNN) head", with_none=False)
    p.add_argument("--batch", default="1,8", help="comma-separated request counts")
    p.add_argument("--repeats", type=positive_int, default=20, help="timings per part (the median is kept)")


def main_bench_overhead(args: argparse.Namespace) -> int:
    """Cost of DSpark's sequential (Markov/RNN) sampling loop as a share of a round (goal ≤ 1.3%)."""
    from dspark import conditions as run_conditions
    from dspark.commands.loading import load_inference_target
    from dspark.data.chat import prompt_ids
    from dspark.data.prompts import load_prompts
    from dspark.drafters.registry import build_drafter
    from dspark.eval.overhead import sequential_head_overhead

    target = load_inference_target(args.target, args.dtype)
    drafter = build_drafter(args.drafter, target)
    if getattr(drafter, "markov_head", None) is None:
        raise DsparkError(f"{args.drafter!r} has no sequential head to measure")
    prompts = [prompt_ids(target.tokenizer, p) for d in ("math", "code", "chat") for p in load_prompts(d, 22)]
    conditions = run_conditions.for_target(target)
    print(
        f"{'R':>4}{'backbone ms':>13}{'parallel ms':>13}{'sequential ms':>15}"
        f"{'verify ms':>11}{'overhead':>10}"
    )
    for R in (int(x) for x in args.batch.split(",")):
        t = sequential_head_overhead(target, drafter, prompts[:R], repeats=args.repeats)
        print(
            f"{R:>4}{t.backbone_s * 1e3:>13.2f}{t.parallel_sampling_s * 1e3:>13.2f}"
            f"{t.sequential_sampling_s * 1e3:>15.2f}{t.verify_s * 1e3:>11.2f}{t.overhead:>10.2%}"
        )
    conditions = conditions.ended()
    print(f"run conditions: {conditions.describe()}")
    if conditions.warning():
        print(f"warning: {conditions.warning()}", file=sys.stderr)
    return 0


def add_bench_serve_args(p: argparse.ArgumentParser) -> None:
    add_target(p)
    add_dtype(p)
    add_drafter(p, default="dflash", purpose="drafter of every policy but 'none'")
    p.add_argument(
        "--policies",
        default="fixed:1,fixed,threshold:0.5,prefix,prefix-async,none",
        help="comma-separated verification policies; 'none' = plain decoding",
    )
    p.add_argument(
        "--concurrency",
        type=int_list,
        default=[1, 2, 4, 8, 16, 32, 64],
        help="comma-separated closed-loop client counts",
    )
    p.add_argument(
        "--prompts", default="math,code,chat", help="comma-separated prompt sets (built-in or JSONL)"
    )
    p.add_argument("--limit", type=positive_int, default=64, help="prompts per set")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="tokens per answer")
    p.add_argument(
        "--requests-per-client", type=positive_int, default=2, help="requests each client sends (at least)"
    )
    p.add_argument(
        "--min-requests", type=positive_int, default=12, help="requests per point at least (low concurrency)"
    )
    add_block_size(p)
    p.add_argument("--max-seq-len", type=positive_int, default=512, help="tokens per KV slot")
    p.add_argument(
        "--no-cost-aware",
        action="store_true",
        help="with --no-payoff-control, prefix policies: draft whenever the early exit allows, even "
        "where drafting costs more time than its expected accepted tokens save",
    )
    add_payoff(p)
    p.add_argument("--out", default="runs/bench_serve", help="folder for results.json and the plot")


def main_bench_serve(args: argparse.Namespace) -> int:
    """Closed-loop clients against the real server: aggregate throughput vs per-user tokens/s per policy."""
    import itertools
    from pathlib import Path

    from dspark import conditions as run_conditions
    from dspark.commands.loading import load_inference_target
    from dspark.data.prompts import load_prompts
    from dspark.drafters.registry import build_drafter
    from dspark.server.load import bench_serve, plot_load

    concurrencies = sorted(set(args.concurrency))
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    sets = [[p.turns[0] for p in load_prompts(spec.strip(), args.limit)] for spec in args.prompts.split(",")]
    # Interleaved (math, code, chat, math, ...): every point, whatever its size, sees the same mix.
    prompts = [p for group in itertools.zip_longest(*sets) for p in group if p is not None]
    target = load_inference_target(args.target, args.dtype)
    drafter = build_drafter(args.drafter, target)
    conditions = run_conditions.for_target(target)

    def show(p) -> None:
        print(
            f"{p.policy:<14}c={p.concurrency:<4}{p.throughput:>9.1f} tok/s  {p.per_user:>7.1f} tok/s/user  "
            f"τ {p.tau:.2f}  verify {p.verify_budget:.2f}",
            file=sys.stderr,
            flush=True,
        )

    points = bench_serve(
        target,
        drafter,
        policies,
        concurrencies,
        prompts,
        max_tokens=args.max_tokens,
        requests_per_client=args.requests_per_client,
        min_requests=args.min_requests,
        block_size=args.block_size,
        max_seq_len=args.max_seq_len,
        cost_aware=not args.no_cost_aware,
        payoff=not args.no_payoff_control,
        choose_proposer=not args.no_proposer_choice,
        progress=show,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    conditions = conditions.ended()
    if conditions.warning():
        print(f"warning: {conditions.warning()}", file=sys.stderr)
    results = {
        "settings": settings,
        "conditions": conditions.as_dict(),
        "points": [p.as_dict() for p in points],
    }
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    plot = plot_load(points, out / "throughput_vs_per_user.png")
    print(json.dumps({"results": str(out / "results.json"), "plot": str(plot)}))
    return 0


def add_bench_round_args(p: argparse.ArgumentParser) -> None:
    add_target(p)
    p.add_argument(
        "--dtypes",
        default="float32,bfloat16",
        help="comma-separated dtypes to load the target in, one after the other in this process",
    )
    add_drafter(p, default="dspark", purpose="a drafter with a sequential (Markov/RNN) head", with_none=False)
    p.add_argument(
        "--untrained",
        action="store_true",
        help="time an untrained DSpark drafter of the shipped one's shape (2 layers, rank 64) built "
        "for --target (timings do not depend on the weights; for targets without a shipped drafter)",
    )
    p.add_argument("--bench", default="math", help="built-in prompt set of the engine decodes")
    p.add_argument("--limit", type=positive_int, default=3, help="prompts decoded through the engine")
    p.add_argument("--max-tokens", type=positive_int, default=48, help="tokens per engine answer")
    add_block_size(p, help="drafts per round (γ)")
    p.add_argument("--repeats", type=positive_int, default=15, help="timings per part (the median is kept)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def main_bench_round(args: argparse.Namespace) -> int:
    """Where a greedy batch-1 round's time goes (eval/round_cost.py), per dtype; the sequential
    loop before issue 17 is timed beside today's."""
    import torch

    from dspark import conditions as run_conditions
    from dspark.commands.loading import load_target
    from dspark.data.chat import prompt_ids
    from dspark.data.prompts import load_prompts
    from dspark.drafters.registry import build_drafter
    from dspark.eval.round_cost import round_breakdown
    from dspark.targets.dtype import DTYPES

    names = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in names if d not in DTYPES]
    if unknown or not names:
        raise DsparkError(f"--dtypes takes {', '.join(DTYPES)}; got {args.dtypes!r}")
    rows, conditions = [], None
    for name in names:
        target = load_target(args.target, dtype=DTYPES[name])
        conditions = conditions or run_conditions.for_target(target)
        drafter = (
            untrained_dspark(target, args.block_size)
            if args.untrained
            else build_drafter(args.drafter, target)
        )
        if getattr(drafter, "markov_head", None) is None:
            raise DsparkError(f"{args.drafter!r} has no sequential head to measure")
        prompts = [prompt_ids(target.tokenizer, p) for p in load_prompts(args.bench, args.limit)]
        with torch.no_grad():
            rows.append(
                round_breakdown(
                    target,
                    drafter,
                    prompts,
                    block_size=args.block_size,
                    max_tokens=args.max_tokens,
                    repeats=args.repeats,
                )
            )
    conditions = conditions.ended()
    if args.json:
        print(json.dumps({"rows": [r.as_dict() for r in rows], "conditions": conditions.as_dict()}, indent=2))
    else:
        parts = [
            ("decode_step_s", "target decode step (1 token)"),
            ("verify_s", "target verify (1 + γ tokens)"),
            ("sampling_s", "target-side sampling + verification"),
            ("backbone_s", "drafter backbone (layers + LM head)"),
            ("loop_before_s", "DSpark loop, before issue 17"),
            ("loop_s", "DSpark loop, now"),
            ("propose_s", "propose, now"),
            ("engine_forward_s", "engine step: target forward"),
            ("engine_draft_s", "engine step: propose"),
            ("engine_update_s", "engine step: drafter update"),
            ("engine_bookkeeping_s", "engine step: bookkeeping"),
        ]
        print(f"{'ms per part':<40}" + "".join(f"{r.dtype:>12}" for r in rows))
        for key, label in parts:
            print(f"{label:<40}" + "".join(f"{getattr(r, key) * 1e3:>12.3f}" for r in rows))
        print(f"{'loop speed-up (before / now)':<40}" + "".join(f"{r.loop_speedup:>11.2f}x" for r in rows))
        print(f"run conditions: {conditions.describe()}")
    if conditions.warning():
        print(f"warning: {conditions.warning()}", file=sys.stderr)
    return 0


def untrained_dspark(target, block_size: int):
    """A seeded random-init DSpark drafter for ``target``, shaped as the shipped tiny one."""
    import torch

    from dspark.drafters.dspark import DSparkConfig, DSparkDrafter

    torch.manual_seed(0)
    mask = target.tokenizer.pad_token_id if target.tokenizer is not None else None
    config = DSparkConfig(num_layers=2, block_size=block_size, markov_rank=64, mask_token_id=mask or 0)
    return DSparkDrafter.from_target(target, config).eval()
