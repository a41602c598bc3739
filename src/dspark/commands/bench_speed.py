"""``dspark bench decode`` and ``dspark bench matrix``: speedups over plain decoding.

Each prints ratios against a baseline run in the same process (the machine is noisy);
the measuring itself lives in :mod:`dspark.bench.decode_speed` and
:mod:`dspark.bench.speed_matrix`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys

from dspark import conditions as run_conditions
from dspark.bench.decode_speed import batch1_engine, bench_decode, verify_cost_ratio
from dspark.bench.speed_matrix import PAYOFF, goals, speed_matrix
from dspark.commands.loading import load_inference_target, load_target
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.errors import DsparkError
from dspark.formats.build import build_drafter


def main_bench_decode(args: argparse.Namespace) -> int:
    """Run ``dspark bench decode`` (arguments: :mod:`~dspark.commands.args.bench_speed`)."""
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


def main_bench_matrix(args: argparse.Namespace) -> int:
    """Run ``dspark bench matrix`` (arguments: :mod:`~dspark.commands.args.bench_speed`)."""
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
            f"{cell.speedup:6.3f}x ±{cell.spread:.3f} (wall {cell.wall_speedup:.3f}x)  τ {cell.tau:.2f}  "
            f"drafted {cell.drafted_share:.0%}  "
            f"identical {cell.identical}  plain A/A {cell.noise:.1%}",
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
        repeats=args.repeats,
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
        first = next(iter(drafters))
        for name in ids:  # the A/A test: plain decoding against itself, per prompt set and concurrency
            row = "".join(f"{by[(name, first, c, PAYOFF)].noise:>15.1%} " for c in concurrencies)
            print(f"{name[-21:]:<22}{'plain A/A':<9}{row}")
        print(
            f"payoff cells: {check['cells']}, min {check['min_speedup']:.3f}x plain; "
            f"below 0.97x: {len(check['below_floor'])} (by more than plain's A/A spread: "
            f"{len(check['below_floor_beyond_noise'])}, by more than two standard errors of their repeats: "
            f"{len(check['below_floor_beyond_spread'])}); below 95% of the best static where it pays: "
            f"{len(check['below_95pct_of_best_static'])}; greedy identical everywhere: "
            f"{check['all_identical']}"
        )
        decide = [u["repeats_to_decide"] for u in check["below_floor_undecided"] if u["repeats_to_decide"]]
        if decide:
            print(
                f"below 0.97x within two standard errors: {len(decide)} cell(s); at their readings "
                f"about {max(decide)} repeats would decide them (--repeats)"
            )
        print(f"run conditions: {conditions.describe()}")
    if conditions.warning():
        print(f"warning: {conditions.warning()}", file=sys.stderr)
    return 0
