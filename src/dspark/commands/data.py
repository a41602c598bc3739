"""``dspark data prompts|regenerate|cache|estimate``: argument parsers and entry points (DESIGN §7).

Each ``main_*`` docstring is its ``--help`` description; the logic lives in the modules
of :mod:`dspark.data`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dspark.commands.argtypes import count, prompt_set, size_bytes
from dspark.commands.argtypes import non_negative_float as _non_negative_float
from dspark.commands.argtypes import positive_int as _positive_int
from dspark.commands.loading import load_target, set_threads
from dspark.commands.options import (
    add_drafter,
    add_force,
    add_no_progress,
    add_sampling,
    add_target,
    add_template_kwargs,
    add_threads,
)
from dspark.data.estimate import estimate_cache, model_dims
from dspark.data.records import read_jsonl
from dspark.errors import DsparkError
from dspark.output_folders import check_not_input, claim_outputs


def _raw_help(p: argparse.ArgumentParser, epilog: str) -> None:
    p.epilog = epilog


# ----------------------------------------------------------------------------- prompts


def add_prompts_args(p: argparse.ArgumentParser) -> None:
    _raw_help(
        p,
        "Output records (JSONL, one per prompt):\n"
        "  id       content key (hash of system message + turns): dedup, split and resume go by it\n"
        "  turns    the user turns, in order\n"
        "  domain   tag: the record's 'domain', else the set's name (file stem, built-in or dataset name)\n"
        "  system   the system message, when the source record had one\n"
        "  source   where it came from: file:line, builtin:domain:i, hf:name:split:i",
    )
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        required=True,
        metavar="SPEC",
        help="prompt set, repeatable: a built-in set (math, code, chat), a JSONL file "
        '({"turns": [...]} or {"conversations": [{"role", "content"}]}), or hf:NAME[:SPLIT]',
    )
    p.add_argument("--out", type=Path, required=True, help="JSONL file for the train prompts")
    p.add_argument("--eval-out", type=Path, default=None, help="JSONL file for the eval prompts")
    p.add_argument(
        "--eval-fraction", type=float, default=0.0, help="share of prompts held out for eval, in [0, 1)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the train/eval split")
    p.add_argument("--limit", type=_positive_int, default=None, help="first N prompts of each set")
    p.add_argument("--domains", default=None, help="comma-separated domain tags to keep (default: all)")
    p.add_argument("--no-dedup", action="store_true", help="keep prompts with identical content")
    add_force(p, "an --out / --eval-out file that no earlier `dspark data prompts` wrote")


def main_prompts(args: argparse.Namespace) -> int:
    """Collect prompt sets into train (and eval) JSONL files: dedup, domain tags, seeded split."""
    from dspark.data.prompts import domain_counts, load_prompt_sets, split_prompts, write_prompts

    if args.eval_fraction > 0 and args.eval_out is None:
        raise DsparkError("--eval-fraction needs --eval-out")
    outputs = {"--out": args.out, "--eval-out": args.eval_out}
    if args.eval_out is not None and args.eval_out.resolve() == args.out.resolve():
        raise DsparkError("--eval-out is --out; give two files")

    def claim(write: bool) -> None:  # checked before reading the sets, claimed before writing
        for flag, path in outputs.items():
            if path is not None:
                check_not_input(path, args.sets, flag)
                claim_outputs(
                    path.parent, [path.name], command="data prompts", flag=flag, force=args.force, write=write
                )

    claim(write=False)
    prompts = load_prompt_sets(
        args.sets,
        limit=args.limit,
        domains=args.domains.split(",") if args.domains else None,
        dedup=not args.no_dedup,
    )
    split = split_prompts(prompts, args.eval_fraction, args.seed)
    claim(write=True)
    write_prompts(split.train, args.out)
    if args.eval_out is not None:
        write_prompts(split.eval, args.eval_out)
    report = {
        "train": len(split.train),
        "eval": len(split.eval),
        "train_domains": domain_counts(split.train),
        "eval_domains": domain_counts(split.eval),
    }
    print(json.dumps(report, indent=2))
    return 0


# ----------------------------------------------------------------------------- regenerate


def add_regenerate_args(p: argparse.ArgumentParser) -> None:
    _raw_help(
        p,
        "Output records (JSONL, one per prompt, appended as each prompt finishes):\n"
        "  id, source, domain   from the prompt set (id = content key, used to resume)\n"
        "  system               the system message used, if any\n"
        "  turns / answers      user turns and the target's answers, answer t given answers < t\n"
        "  finish_reasons       per turn: stop (EOS / stop string) or length (--max-tokens)\n"
        "  num_tokens           per turn: completion tokens (as the backend reports them)\n"
        "  sampling             temperature, top_p, top_k, max_tokens, stop, seed (turn t: seed + t)\n"
        "  template_kwargs      chat template kwargs the prompts were rendered with\n"
        "  backend              inprocess:<target> or http:<model>\n"
        "Errors (JSONL): id, source, turn, reason, retryable. Rerunning the same command\n"
        "resumes: answered prompts and permanent failures are skipped, the rest retried.\n"
        "Over HTTP the server renders the chat template; the kwargs go as chat_template_kwargs.",
    )
    p.add_argument(
        "--prompts",
        action="append",
        type=prompt_set,
        required=True,
        metavar="SPEC",
        help="prompt set, repeatable: JSONL file, built-in set or hf:NAME[:SPLIT] (as `dspark data prompts`)",
    )
    p.add_argument("--out", type=Path, required=True, help="output JSONL (appended to; resumable)")
    p.add_argument("--errors", type=Path, default=None, help="error JSONL (default: OUT with .errors.jsonl)")
    p.add_argument("--limit", type=_positive_int, default=None, help="first N prompts of each set")
    add_target(p, help="in-process backend: HF model folder or hub id (default: the embedded tiny target)")
    add_drafter(p, default="ngram", purpose="in-process: drafter for speed only (lossless)")
    p.add_argument(
        "--base-url",
        action="append",
        default=[],
        metavar="URL",
        help="OpenAI-compatible server (vLLM, SGLang, dspark serve), repeatable: requests go round-robin",
    )
    p.add_argument("--model", default=None, help="HTTP: model name (default: the first in /v1/models)")
    p.add_argument("--api-key", default=None, help="HTTP: bearer token")
    p.add_argument(
        "--concurrency",
        type=_positive_int,
        default=None,
        help="prompts in flight (default: 8; in-process, the engine batches them)",
    )
    p.add_argument("--timeout", type=_non_negative_float, default=600.0, help="HTTP: seconds per request")
    p.add_argument("--retries", type=int, default=3, help="HTTP: retries per request after the first attempt")
    p.add_argument("--max-tokens", type=_positive_int, default=2048, help="most tokens per answer")
    add_sampling(p, seed_help="base seed; each prompt derives its own from it")
    p.add_argument("--system", default=None, help="system message for prompts that have none")
    add_template_kwargs(p)
    add_threads(p, help="in-process: torch CPU threads")
    add_no_progress(p)


def main_regenerate(args: argparse.Namespace) -> int:
    """Have the target answer every prompt, turn by turn, in-process or over OpenAI-compatible HTTP."""
    from dspark.data.prompts import load_prompt_sets
    from dspark.data.regenerate import RegenerateConfig, regenerate
    from dspark.protocols import SamplingParams

    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    template_kwargs = args.template_kwargs
    errors = args.errors or args.out.with_name(args.out.stem + ".errors.jsonl")
    check_not_input(args.out, args.prompts, "--out")
    check_not_input(errors, [*args.prompts, args.out], "--errors")
    prompts = load_prompt_sets(args.prompts, limit=args.limit)
    if args.base_url:
        from dspark.data.http_backend import HttpBackend, HttpConfig

        backend = HttpBackend(
            HttpConfig(
                base_urls=tuple(args.base_url),
                model=args.model,
                api_key=args.api_key,
                timeout_s=args.timeout,
                max_retries=args.retries,
                template_kwargs=template_kwargs,
            )
        )
        concurrency = args.concurrency or 8
    else:
        from dspark.data.regenerate import InProcessBackend
        from dspark.formats.build import build_drafter

        set_threads(args.threads)
        target = load_target(args.target)
        backend = InProcessBackend(
            target, drafter=build_drafter(args.drafter, target), template_kwargs=template_kwargs
        )
        concurrency = args.concurrency or backend.max_concurrency
    config = RegenerateConfig(concurrency=concurrency, system=args.system, progress=not args.no_progress)
    summary = regenerate(prompts, backend, args.out, errors, params, config)
    report = {
        "total": summary.total,
        "resumed": summary.resumed,
        "done": summary.done,
        "failed": summary.failed,
        "skipped_permanent_failures": summary.skipped,
        "completion_tokens": summary.completion_tokens,
        "seconds": round(summary.seconds, 3),
        "tokens_per_s": round(summary.tokens_per_s, 2),
        "out": str(args.out),
        "errors": str(errors),
    }
    print(json.dumps(report, indent=2))
    if summary.failed:
        print(
            f"dspark: {summary.failed} prompts failed; reasons in {errors}; rerun to retry", file=sys.stderr
        )
        return 1
    return 0


# ----------------------------------------------------------------------------- cache


def add_cache_args(p: argparse.ArgumentParser) -> None:
    _raw_help(
        p,
        "Writes OUT/manifest.json (target identity, feature layer ids, hidden size, chat template\n"
        "hash and kwargs, max length, dtype, data fingerprint, per-shard sha256), OUT/index.bin\n"
        "(int64 [N, 3]: shard, byte offset, tokens) and OUT/shard-RRRRR-KKKKK.bin (per sample:\n"
        "features [T, L, H], final-normed hidden [T, H], fp8 scales, int32 ids, uint8 loss mask).\n"
        "Prints the size estimate first and refuses to start when the disk cannot hold it.\n"
        "Several processes: torchrun --nproc-per-node N --no-python dspark data cache ...\n"
        "(each rank writes its own shards; rank 0 writes the index and the manifest last).",
    )
    p.add_argument(
        "--data",
        type=Path,
        required=True,
        help="training records JSONL: regenerated records (turns + answers) or conversations",
    )
    p.add_argument("--out", type=Path, required=True, help="cache folder")
    add_target(p)
    p.add_argument(
        "--layer-ids",
        default=None,
        help="comma-separated feature layers (default: the adapter's, min(5, n-1) spread evenly); "
        "must match the drafter's target_layer_ids",
    )
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp8", "fp32"], default="bf16", help="stored dtype")
    p.add_argument("--max-length", type=_positive_int, default=1024, help="tokens per sample (as training)")
    add_template_kwargs(p)
    p.add_argument("--shard-size", type=size_bytes, default=10**9, help="bytes per shard, e.g. 512MB, 2GB")
    p.add_argument(
        "--target-dtype",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="dtype the target runs in (auto: bf16 on GPU, fp32 on CPU)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing cache in OUT")
    add_threads(p)
    add_no_progress(p)


def main_cache(args: argparse.Namespace) -> int:
    """Build the offline feature cache: target features of every training token, sharded, checksummed."""
    import torch

    from dspark.training import distributed
    from dspark.training.feature_cache import CacheBuildConfig, build_cache

    set_threads(args.threads)
    if not args.data.is_file():
        raise DsparkError(f"no training records at {args.data}")
    records = read_jsonl(args.data)
    with distributed.launch() as world:
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(
            args.target_dtype, torch.bfloat16 if world.device.type == "cuda" else torch.float32
        )
        layer_ids = [int(i) for i in args.layer_ids.split(",")] if args.layer_ids else None
        try:
            target = load_target(args.target, dtype=dtype, device=world.device, target_layer_ids=layer_ids)
        except ValueError as e:  # bad layer ids
            raise DsparkError(str(e)) from None
        config = CacheBuildConfig(
            dtype=args.dtype,
            max_length=args.max_length,
            template_kwargs=args.template_kwargs,
            shard_bytes=args.shard_size,
            overwrite=args.overwrite,
            progress=not args.no_progress,
        )
        manifest = build_cache(
            target,
            records,
            args.out,
            config,
            source=str(args.data),
            world=world,
            announce=lambda estimate: print(estimate.describe(), flush=True),
        )
    if world.is_main:
        data = manifest["data"]
        real = sum(s["bytes"] for s in manifest["shards"]) + manifest["index"]["bytes"]
        print(
            json.dumps(
                {
                    "out": str(args.out),
                    "samples": data["num_samples"],
                    "tokens": data["num_tokens"],
                    "shards": len(manifest["shards"]),
                    "bytes": real,
                    "bytes_per_token": round(real / max(data["num_tokens"], 1), 1),
                    "estimated_bytes": manifest["estimate"]["total_bytes"],
                },
                indent=2,
            )
        )
    return 0


# ----------------------------------------------------------------------------- estimate


def add_estimate_args(p: argparse.ArgumentParser) -> None:
    _raw_help(
        p,
        "bytes/token = (m+1)·H·dtype_bytes + 4 (int32 id) + 1 (mask) [+ 4·(m+1) fp8 scales]\n"
        "  H  hidden size            (--hidden-size, or from --target's config.json)\n"
        "  m  feature layers         (--feature-layers; default with --target: min(5, n_layers-1))\n"
        "  +1 the final-normed last hidden state (V-sized logits are never stored)\n"
        "DeepSpec's default, Qwen3-4B (H 2560, m 5, bf16): 30,720 B ≈ 30.7 KB/token.",
    )
    p.add_argument("--hidden-size", type=_positive_int, default=None, help="H")
    p.add_argument("--feature-layers", type=int, default=None, help="m, the number of feature layers")
    add_target(p, help="model folder whose config.json gives H (and m)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp8", "fp32"], default="bf16", help="stored dtype")
    p.add_argument(
        "--tokens", type=count, default=None, help="number of training tokens: 1000000, 1e9, 1.25B, 500M"
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="count the tokens of this records JSONL with --target's tokenizer and chat template",
    )
    p.add_argument("--max-length", type=_positive_int, default=1024, help="with --data: tokens per sample")
    add_template_kwargs(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _count_tokens(target: str, data: Path, max_length: int, template_kwargs: dict) -> int:
    from transformers import AutoTokenizer

    from dspark.data.samples import tokenize_records

    tokenizer = AutoTokenizer.from_pretrained(target)
    dataset = tokenize_records(
        read_jsonl(data), tokenizer, max_length=max_length, template_kwargs=template_kwargs
    )
    return sum(s.input_ids.numel() for s in dataset)


def main_estimate(args: argparse.Namespace) -> int:
    """Bytes per token and total size of a feature cache, from the numbers or a model's config."""
    from dspark.presets.tiny import resolve_target
    from dspark.targets.adapter import default_layer_ids

    hidden, layers = args.hidden_size, args.feature_layers
    target = resolve_target(args.target) if args.target is not None or args.data is not None else None
    if target is not None and (hidden is None or layers is None):
        h, n = model_dims(target)
        hidden = hidden or h
        layers = layers if layers is not None else len(default_layer_ids(n))
    if hidden is None or layers is None:
        raise DsparkError("give --hidden-size and --feature-layers, or --target")
    tokens = args.tokens
    if tokens is None and args.data is not None:
        tokens = _count_tokens(target, args.data, args.max_length, args.template_kwargs)
    if tokens is None:
        raise DsparkError("give --tokens, or --data with --target")
    est = estimate_cache(hidden, layers, args.dtype, tokens)
    if args.json:
        print(json.dumps(est.as_dict()))
    else:
        print(est.describe())
    return 0
