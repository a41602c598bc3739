"""``dspark serve``: the engine behind the OpenAI-compatible HTTP API, on uvicorn (SPEC §10).

SIGTERM (or Ctrl+C) drains: the listening socket closes at once, requests on open
connections get 503, and the requests already running (streams included) are finished
before the engine stops, for at most ``--drain-timeout`` seconds. A drained shutdown
exits with status 0.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys

from dspark.argtypes import non_negative_float, positive_int
from dspark.errors import DsparkError

logger = logging.getLogger(__name__)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target", default=None, help="HF model folder or hub id (default: the embedded tiny target)"
    )
    p.add_argument(
        "--drafter",
        default="ngram",
        help="none | ngram | dflash | dspark | eagle3 (shipped for the tiny target) | a drafter folder",
    )
    p.add_argument(
        "--scheduler",
        default="prefix",
        help="verification policy: fixed | fixed:k | threshold:t | prefix | prefix-async (SPEC §9)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0 = any free port)")
    p.add_argument(
        "--model-name",
        default=None,
        help="the model id clients send (default: the --target folder's name or hub id, or 'tiny')",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health (visible in ps: prefer "
        "--api-key-file or the DSPARK_API_KEY environment variable)",
    )
    p.add_argument(
        "--api-key-file", default=None, help="read the API key from this file (instead of --api-key)"
    )
    p.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=None,
        help="largest request body (default: room for the longest prompt that fits the context); more: 413",
    )
    p.add_argument("--max-batch", type=positive_int, default=32, help="KV slots: requests decoded at once")
    p.add_argument(
        "--max-queue", type=int, default=128, help="requests waiting for a slot; more get HTTP 429"
    )
    p.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=None,
        help="tokens per request, prompt + answer (default: the engine's)",
    )
    p.add_argument("--block-size", type=positive_int, default=7, help="most drafts per request per step (γ)")
    p.add_argument(
        "--sps-profile", default=None, help="SPS profile to load or create (default: the per-target cache)"
    )
    p.add_argument(
        "--no-cost-aware",
        action="store_true",
        help="prefix policies: draft whenever the early exit allows, even where drafting costs more "
        "time than its expected accepted tokens save",
    )
    p.add_argument(
        "--drain-timeout",
        type=non_negative_float,
        default=60.0,
        help="seconds to finish running requests on SIGTERM",
    )


def main_serve(args: argparse.Namespace) -> int:
    """Serve a target with batched speculative decoding over an OpenAI-compatible HTTP API.

    Routes: POST /v1/completions, POST /v1/chat/completions (``"stream": true`` for SSE),
    GET /v1/models, GET /health (503 when the engine is dead or draining), GET /metrics
    (Prometheus), GET /openapi.json.
    """
    from dspark.drafters.registry import build_drafter
    from dspark.engine import Engine, EngineConfig
    from dspark.engine.worker import EngineWorker
    from dspark.presets.tiny import resolve_target
    from dspark.server.app import create_app
    from dspark.server.identity import resolve_api_key, served_model_name
    from dspark.server.uvicorn_runner import serve
    from dspark.targets import TargetAdapter

    if args.max_queue < 0:
        raise DsparkError(f"--max-queue must be >= 0, got {args.max_queue}")
    try:
        config = EngineConfig(
            block_size=args.block_size,
            policy=args.scheduler,
            max_batch=args.max_batch,
            max_seq_len=args.max_seq_len,
            sps_path=args.sps_profile,
            cost_aware=not args.no_cost_aware,
        )
    except ValueError as e:
        raise DsparkError(str(e)) from None
    api_key = resolve_api_key(args.api_key, args.api_key_file)
    model_name = served_model_name(args.target, args.model_name)
    sock = _listen(args.host, args.port)
    target = TargetAdapter.from_pretrained(resolve_target(args.target))
    drafter = build_drafter(args.drafter, target)
    worker = EngineWorker(Engine(target, drafter, config))
    app = create_app(
        worker, model_name, api_key=api_key, max_queue=args.max_queue, max_body_bytes=args.max_body_bytes
    )
    host, port = sock.getsockname()[:2]
    print(
        f"dspark: serving {model_name!r} at http://{host}:{port} (drafter {args.drafter}, "
        f"scheduler {args.scheduler}, {config.max_batch} slots x {worker.engine.kv.capacity} tokens)",
        file=sys.stderr,
        flush=True,
    )
    try:
        serve(
            app,
            sock,
            drain_timeout=args.drain_timeout,
            verbose=logging.getLogger().isEnabledFor(logging.INFO),
        )
    finally:
        worker.close(timeout=30)
        sock.close()
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """Bind before loading the model, so a taken port fails fast."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        raise DsparkError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def add_bench_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target", default=None, help="HF model folder or hub id (default: the embedded tiny target)"
    )
    p.add_argument("--drafter", default="dflash", help="drafter of every policy but 'none'")
    p.add_argument(
        "--policies",
        default="fixed:1,fixed,threshold:0.5,prefix,prefix-async,none",
        help="comma-separated verification policies; 'none' = plain decoding",
    )
    p.add_argument(
        "--concurrency", default="1,2,4,8,16,32,64", help="comma-separated closed-loop client counts"
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
    p.add_argument("--block-size", type=positive_int, default=7, help="most drafts per request per step (γ)")
    p.add_argument("--max-seq-len", type=positive_int, default=512, help="tokens per KV slot")
    p.add_argument(
        "--no-cost-aware",
        action="store_true",
        help="prefix policies: draft whenever the early exit allows, even where drafting costs more "
        "time than its expected accepted tokens save",
    )
    p.add_argument("--out", default="runs/bench_serve", help="folder for results.json and the plot")


def main_bench_serve(args: argparse.Namespace) -> int:
    """Closed-loop clients against the real server: aggregate throughput vs per-user tokens/s per policy."""
    import itertools
    import json
    from pathlib import Path

    from dspark.data.prompts import load_prompts
    from dspark.drafters.registry import build_drafter
    from dspark.presets.tiny import resolve_target
    from dspark.server.bench import bench_serve, plot_load
    from dspark.targets import TargetAdapter

    try:
        concurrencies = sorted({int(c) for c in args.concurrency.split(",")})
    except ValueError:
        raise DsparkError(f"--concurrency takes comma-separated integers, got {args.concurrency!r}") from None
    if concurrencies[0] < 1:
        raise DsparkError("--concurrency values must be >= 1")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    sets = [[p.turns[0] for p in load_prompts(spec.strip(), args.limit)] for spec in args.prompts.split(",")]
    # Interleaved (math, code, chat, math, ...): every point, whatever its size, sees the same mix.
    prompts = [p for group in itertools.zip_longest(*sets) for p in group if p is not None]
    target = TargetAdapter.from_pretrained(resolve_target(args.target))
    drafter = build_drafter(args.drafter, target)

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
        progress=show,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    results = {"settings": settings, "points": [p.as_dict() for p in points]}
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    plot = plot_load(points, out / "throughput_vs_per_user.png")
    print(json.dumps({"results": str(out / "results.json"), "plot": str(plot)}))
    return 0
