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

from dspark.commands.loading import load_inference_target
from dspark.engine import Engine, EngineConfig
from dspark.engine.worker import EngineWorker
from dspark.errors import DsparkError
from dspark.formats.build import build_drafter
from dspark.server.app import create_app
from dspark.server.identity import resolve_api_key, served_model_name
from dspark.server.uvicorn_runner import serve

logger = logging.getLogger(__name__)


def main_serve(args: argparse.Namespace) -> int:
    """Run ``dspark serve`` (arguments: :mod:`~dspark.commands.args.serve`)."""
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
