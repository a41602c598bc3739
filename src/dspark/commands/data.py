"""``dspark data prompts|regenerate|cache|estimate``: entry points (DESIGN §7).

The logic lives in the modules of :mod:`dspark.data`; the arguments and the ``--help``
texts in :mod:`dspark.commands.args.data`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from dspark.commands.loading import load_target, set_threads
from dspark.data.estimate import estimate_cache, model_dims
from dspark.data.http_backend import HttpBackend, HttpConfig
from dspark.data.prompts import domain_counts, load_prompt_sets, split_prompts, write_prompts
from dspark.data.records import read_jsonl
from dspark.data.regenerate import InProcessBackend, RegenerateConfig, regenerate
from dspark.data.samples import tokenize_records
from dspark.errors import DsparkError
from dspark.formats.build import build_drafter
from dspark.output_folders import check_not_input, claim_outputs
from dspark.presets.tiny import resolve_target
from dspark.protocols import SamplingParams
from dspark.targets.adapter import default_layer_ids
from dspark.training import distributed
from dspark.training.feature_cache import CacheBuildConfig, build_cache


def main_prompts(args: argparse.Namespace) -> int:
    """Run ``dspark data prompts`` (arguments: :mod:`~dspark.commands.args.data`)."""
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


def main_regenerate(args: argparse.Namespace) -> int:
    """Run ``dspark data regenerate`` (arguments: :mod:`~dspark.commands.args.data`)."""
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


def main_cache(args: argparse.Namespace) -> int:
    """Run ``dspark data cache`` (arguments: :mod:`~dspark.commands.args.data`)."""
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


def _count_tokens(target: str, data: Path, max_length: int, template_kwargs: dict) -> int:
    tokenizer = AutoTokenizer.from_pretrained(target)
    dataset = tokenize_records(
        read_jsonl(data), tokenizer, max_length=max_length, template_kwargs=template_kwargs
    )
    return sum(s.input_ids.numel() for s in dataset)


def main_estimate(args: argparse.Namespace) -> int:
    """Run ``dspark data estimate`` (arguments: :mod:`~dspark.commands.args.data`)."""
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
