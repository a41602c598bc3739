"""``dspark data prompts|regenerate|cache|estimate``: their arguments and ``--help`` texts; the run is
:mod:`dspark.commands.data`."""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.commands.argtypes import count, prompt_set, size_bytes
from dspark.commands.argtypes import non_negative_float as _non_negative_float
from dspark.commands.argtypes import positive_int as _positive_int
from dspark.commands.options import (
    add_drafter,
    add_force,
    add_no_progress,
    add_sampling,
    add_target,
    add_template_kwargs,
    add_threads,
)


def _raw_help(p: argparse.ArgumentParser, epilog: str) -> None:
    p.epilog = epilog


# ----------------------------------------------------------------------------- prompts


def add_prompts_args(p: argparse.ArgumentParser) -> None:
    """Collect prompt sets into train (and eval) JSONL files: dedup, domain tags, seeded split."""
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


# ----------------------------------------------------------------------------- regenerate


def add_regenerate_args(p: argparse.ArgumentParser) -> None:
    """Have the target answer every prompt, turn by turn, in-process or over OpenAI-compatible HTTP."""
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


# ----------------------------------------------------------------------------- cache


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """Build the offline feature cache: target features of every training token, sharded, checksummed."""
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


# ----------------------------------------------------------------------------- estimate


def add_estimate_args(p: argparse.ArgumentParser) -> None:
    """Bytes per token and total size of a feature cache, from the numbers or a model's config."""
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
