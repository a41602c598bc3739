"""The ``dspark`` command line: a table of subcommands, each calling into the library.

Every subcommand is a function ``main_<verb>(args)`` whose docstring is its ``--help``
text. User mistakes (a bad path, a bad number, a prompt too long) end with a one-line
``dspark: error: ...`` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from dspark.argtypes import non_negative_float as _non_negative_float
from dspark.argtypes import positive_int as _positive_int
from dspark.calibration.commands import add_calibrate_args, main_calibrate
from dspark.data.commands import (
    add_cache_args,
    add_estimate_args,
    add_prompts_args,
    add_regenerate_args,
    main_cache,
    main_estimate,
    main_prompts,
    main_regenerate,
)
from dspark.drafters.commands import add_export_args, main_export
from dspark.engine.commands import add_profile_args, main_profile
from dspark.errors import DsparkError
from dspark.eval.commands import (
    add_eval_args,
    add_sweep_block_size_args,
    add_sweep_depth_args,
    main_eval,
    main_sweep_block_size,
    main_sweep_depth,
)
from dspark.quickstart.commands import add_quickstart_args, main_quickstart
from dspark.server.commands import add_bench_serve_args, add_serve_args, main_bench_serve, main_serve
from dspark.training.commands import add_train_args, main_train

# ----------------------------------------------------------------------------- generate


def _add_generate(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prompt", required=True, help="the user message; applied through the target's chat template"
    )
    p.add_argument(
        "--target", default=None, help="HF model folder or hub id (default: the embedded tiny target)"
    )
    p.add_argument(
        "--drafter",
        default="ngram",
        help="'ngram' (prompt lookup), 'none' (plain decoding), or a registered drafter name",
    )
    p.add_argument("--temperature", type=_non_negative_float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--max-tokens", type=_positive_int, default=256, help="most tokens to generate")
    p.add_argument("--block-size", type=_positive_int, default=7, help="most drafts verified per round (γ)")
    p.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template to the prompt")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (text, num_tokens, tau, tokens_per_s) instead of streaming",
    )


def main_generate(args: argparse.Namespace) -> int:
    """Generate an answer with speculative decoding; τ and tokens/s go to stderr."""
    from dspark.drafters.registry import build_drafter
    from dspark.engine import Engine, EngineConfig
    from dspark.presets.tiny import resolve_target
    from dspark.protocols import SamplingParams
    from dspark.targets import TargetAdapter

    params = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
        seed=args.seed,
    )
    target = TargetAdapter.from_pretrained(resolve_target(args.target))
    drafter = build_drafter(args.drafter, target)
    tok = target.tokenizer
    if args.raw:
        prompt_ids = tok(args.prompt)["input_ids"]
    else:
        messages = [{"role": "user", "content": args.prompt}]
        prompt_ids = list(
            tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"
            ]
        )

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True)

    streamed: list[int] = []
    printed = 0

    def stream(new: list[int]) -> None:
        nonlocal printed
        streamed.extend(new)
        text = decode(streamed)
        # Hold back a trailing partial UTF-8 character until the next tokens complete it.
        safe = len(text.rstrip("\ufffd"))
        sys.stdout.write(text[printed:safe])
        sys.stdout.flush()
        printed = max(printed, safe)

    # One request through the engine (a KV slot just big enough for it), verifying all γ drafts.
    capacity = min(target.max_context, len(prompt_ids) + args.max_tokens)
    config = EngineConfig(block_size=args.block_size, policy="fixed", max_batch=1, max_seq_len=capacity)
    engine = Engine(target, drafter, config, decode=decode)
    request = engine.submit(prompt_ids, params, on_tokens=None if args.json else stream)
    while engine.has_work():
        engine.step()
    result = engine.pop_result(request)
    if args.json:
        print(
            json.dumps(
                {
                    "text": result.text,
                    "num_tokens": len(result.token_ids),
                    "tau": result.tau,
                    "tokens_per_s": result.tokens_per_s,
                    "finish_reason": result.finish_reason,
                }
            )
        )
    else:
        sys.stdout.write(result.text[printed:] + "\n")
        print(
            f"τ = {result.tau:.2f} tokens/round, {result.tokens_per_s:.1f} tokens/s, "
            f"{len(result.token_ids)} tokens ({result.finish_reason})",
            file=sys.stderr,
        )
    return 0


# ----------------------------------------------------------------------------- build-tiny-target


def _add_build_tiny(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output model folder (default: the package's embedded tiny target)",
    )
    p.add_argument(
        "--prompts-out",
        type=Path,
        default=None,
        help="folder for the built-in prompt sets (default: the package's)",
    )
    p.add_argument("--steps", type=_positive_int, default=None, help="training steps (default: the preset's)")
    p.add_argument("--threads", type=_positive_int, default=None, help="torch CPU threads")


def main_build_tiny_target(args: argparse.Namespace) -> int:
    """Rebuild the embedded tiny target: offline corpus, BPE tokenizer, Qwen3 training (SPEC §11)."""
    import dataclasses

    import torch

    from dspark.presets.tiny import assets_dir
    from dspark.tiny.build import TinyTargetConfig, build_tiny_target

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = TinyTargetConfig()
    if args.steps:
        cfg = dataclasses.replace(cfg, steps=args.steps)
    out = args.out or assets_dir() / "tiny_target"
    prompts = args.prompts_out or assets_dir() / "prompts"
    manifest = build_tiny_target(out, prompts, cfg)
    print(json.dumps({k: manifest[k] for k in ("parameters", "build_seconds", "held_out_loss")}, indent=2))
    return 0


# ----------------------------------------------------------------------------- bench


def _add_bench_decode(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target", default=None, help="HF model folder or hub id (default: the embedded tiny target)"
    )
    p.add_argument(
        "--bench",
        default="code",
        help="comma-separated prompt sets: built-in names (math, code, chat) or JSONL paths",
    )
    p.add_argument("--limit", type=_positive_int, default=20, help="prompts per set")
    p.add_argument("--drafters", default="none,ngram", help="comma-separated drafters to compare")
    p.add_argument("--max-tokens", type=_positive_int, default=128, help="tokens per answer")
    p.add_argument("--block-size", type=_positive_int, default=7, help="most drafts per round (γ)")
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
    p.add_argument(
        "--temperature", type=_non_negative_float, default=0.0, help="0 = greedy (default); > 0 samples"
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
    from dspark.data.prompts import load_prompts
    from dspark.drafters.registry import build_drafter
    from dspark.eval.decode_bench import batch1_engine, bench_decode, verify_cost_ratio
    from dspark.presets.tiny import resolve_target
    from dspark.targets import TargetAdapter

    target = TargetAdapter.from_pretrained(resolve_target(args.target))
    drafters = {name: build_drafter(name, target) for name in args.drafters.split(",")}
    policies = [p.strip() for p in args.engine_policies.split(",") if p.strip()]
    engines = {
        f"{name}@{policy}": batch1_engine(target, drafter, policy, block_size=args.block_size)
        for name, drafter in drafters.items()
        if drafter is not None
        for policy in policies
    }
    assistant = None
    if args.hf_assistant:
        assistant = TargetAdapter.from_pretrained(args.hf_assistant, dtype=target.dtype).model
    out = []
    for bench in args.bench.split(","):
        prompts = load_prompts(bench, args.limit)
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
    if args.json:
        print(json.dumps({"rows": out, "verify_k_over_decode1": ratios}, indent=2))
    else:
        print(f"{'bench':<24}{'method':<18}{'tok/s':>9}{'tau':>7}{'speedup':>9}  identical")
        for r in out:
            print(
                f"{r['bench'][-24:]:<24}{r['method']:<18}{r['tokens_per_s']:>9.1f}{r['tau']:>7.2f}"
                f"{r['speedup']:>9.3f}  {r['identical_to_baseline']}"
            )
        for k, ratio in ratios.items():
            print(f"verify {k} tokens / decode 1 token: {ratio:.2f}x")
    return 0


def _add_bench_target(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target", default=None, help="HF model folder or hub id (default: the embedded tiny target)"
    )
    p.add_argument("--limit", type=_positive_int, default=40, help="prompts per built-in domain")
    p.add_argument("--max-tokens", type=_positive_int, default=384, help="tokens per answer")
    p.add_argument("--samples", type=int, default=3, help="sample answers to print per domain")


def main_bench_target(args: argparse.Namespace) -> int:
    """How structured the target's greedy answers are on the built-in math/code/chat prompts."""
    from dspark.eval.target_report import target_report
    from dspark.presets.tiny import resolve_target
    from dspark.targets import TargetAdapter

    target = TargetAdapter.from_pretrained(resolve_target(args.target))
    reports = target_report(target, limit=args.limit, max_tokens=args.max_tokens, samples=args.samples)
    print(json.dumps([r.as_dict() for r in reports], indent=2))
    for r in reports:
        for prompt, answer in r.samples:
            print(f"\n### {r.domain}\n**Prompt:** {prompt}\n\n**Answer:**\n{answer}")
    return 0


def _add_bench_overhead(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target", default=None, help="HF model folder or hub id (default: the embedded tiny target)"
    )
    p.add_argument("--drafter", default="dspark", help="a DSpark drafter: 'dspark' (shipped) or a folder")
    p.add_argument("--batch", default="1,8", help="comma-separated request counts")
    p.add_argument("--repeats", type=_positive_int, default=20, help="timings per part (the median is kept)")


def main_bench_overhead(args: argparse.Namespace) -> int:
    """Cost of DSpark's sequential (Markov/RNN) sampling loop as a share of a round (goal ≤ 1.3%)."""
    from dspark.data.prompts import load_prompts
    from dspark.drafters.registry import build_drafter
    from dspark.eval.decode_bench import chat_prompt_ids
    from dspark.eval.overhead import sequential_head_overhead
    from dspark.presets.tiny import resolve_target
    from dspark.targets import TargetAdapter

    target = TargetAdapter.from_pretrained(resolve_target(args.target))
    drafter = build_drafter(args.drafter, target)
    if getattr(drafter, "markov_head", None) is None:
        raise DsparkError(f"{args.drafter!r} has no sequential head to measure")
    prompts = [chat_prompt_ids(target, p) for d in ("math", "code", "chat") for p in load_prompts(d, 22)]
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
    return 0


# ----------------------------------------------------------------------------- the table

COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "quickstart": (add_quickstart_args, main_quickstart),
    "generate": (_add_generate, main_generate),
    "build-tiny-target": (_add_build_tiny, main_build_tiny_target),
    "train": (add_train_args, main_train),
    "bench decode": (_add_bench_decode, main_bench_decode),
    "bench target": (_add_bench_target, main_bench_target),
    "bench markov-overhead": (_add_bench_overhead, main_bench_overhead),
    "profile": (add_profile_args, main_profile),
    "serve": (add_serve_args, main_serve),
    "bench serve": (add_bench_serve_args, main_bench_serve),
    "data prompts": (add_prompts_args, main_prompts),
    "data regenerate": (add_regenerate_args, main_regenerate),
    "data cache": (add_cache_args, main_cache),
    "data estimate": (add_estimate_args, main_estimate),
    "eval": (add_eval_args, main_eval),
    "calibrate": (add_calibrate_args, main_calibrate),
    "export": (add_export_args, main_export),
    "sweep block-size": (add_sweep_block_size_args, main_sweep_block_size),
    "sweep depth": (add_sweep_depth_args, main_sweep_depth),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dspark", description="Lossless speculative decoding: train, evaluate and serve drafters."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    parser.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        dest="torch_threads",
        help="torch CPU threads (default: torch's choice; 1 is best on a busy 2-core machine)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for name, (add_args, fn) in COMMANDS.items():
        doc = (fn.__doc__ or "").strip().replace("%", "%%")  # argparse formats help with %
        group, _, verb = name.rpartition(" ")
        if group and group not in groups:  # "bench decode" → `dspark bench decode`
            gp = sub.add_parser(group, help=f"{group} subcommands")
            groups[group] = gp.add_subparsers(dest=f"{group}_command", required=True, metavar="SUBCOMMAND")
        p = (groups[group] if group else sub).add_parser(
            verb, help=doc.splitlines()[0] if doc else None, description=doc
        )
        add_args(p)
        p.set_defaults(_fn=fn)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bar on every command
    try:
        return args._fn(args)
    except DsparkError as e:
        # User mistakes: one line, no traceback (a library bug is not caught here).
        parser.exit(2, f"dspark: error: {e}\n")
    except KeyboardInterrupt:
        return 130
