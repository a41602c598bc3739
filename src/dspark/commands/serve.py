"""``dspark serve``: the engine behind the OpenAI-compatible HTTP API, on uvicorn (DESIGN §10).

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

from dspark.commands.argtypes import non_negative_float, positive_int, tcp_port
from dspark.commands.loading import load_inference_target
from dspark.commands.options import add_block_size, add_drafter, add_dtype, add_payoff, add_target
from dspark.errors import DsparkError
from dspark.server.identity import resolve_api_key, served_model_name

logger = logging.getLogger(__name__)


class _PolicyArgument(argparse.Action):
    """``--scheduler``: its help lists the rows of the scheduler's policy registry.

    The registry imports torch, so the list is read when the help is shown, not when the
    parser is built (``dspark`` answers argument errors without importing torch).
    """

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)

    @property
    def help(self) -> str:
        from dspark.scheduler.policies import policy_spellings

        return f"verification policy: {policy_spellings()} (DESIGN §9)"

    @help.setter
    def help(self, value: str | None) -> None:  # argparse assigns it; the property is the help
        pass


def add_serve_args(p: argparse.ArgumentParser) -> None:
    add_target(p)
    add_dtype(p)
    add_drafter(p, default="ngram")
    p.add_argument(
        "--scheduler",
        default="prefix",
        action=_PolicyArgument,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    p.add_argument("--port", type=tcp_port, default=8000, help="port to listen on (0 = any free port)")
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
    add_block_size(p)
    p.add_argument(
        "--sps-profile", default=None, help="SPS profile to load or create (default: the per-target cache)"
    )
    add_payoff(p)
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
    from dspark.engine import Engine, EngineConfig
    from dspark.engine.worker import EngineWorker
    from dspark.formats.build import build_drafter
    from dspark.server.app import create_app
    from dspark.server.uvicorn_runner import serve

    if args.max_queue < 0:
        raise DsparkError(f"--max-queue must be >= 0, got {args.max_queue}")
    try:
        config = EngineConfig(
            block_size=args.block_size,
            policy=args.scheduler,
            max_batch=args.max_batch,
            max_seq_len=args.max_seq_len,
            sps_path=args.sps_profile,
            payoff=not args.no_payoff_control,
            choose_proposer=not args.no_proposer_choice,
        )
    except ValueError as e:
        raise DsparkError(str(e)) from None
    api_key = resolve_api_key(args.api_key, args.api_key_file)
    model_name = served_model_name(args.target, args.model_name)
    sock = _listen(args.host, args.port)
    target = load_inference_target(args.target, args.dtype)
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
