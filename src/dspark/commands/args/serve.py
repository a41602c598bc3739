"""``dspark serve``: its arguments and ``--help`` text; the run is :mod:`dspark.commands.serve`."""

from __future__ import annotations

import argparse

from dspark.commands.argtypes import non_negative_float, positive_int, tcp_port
from dspark.commands.options import add_block_size, add_drafter, add_dtype, add_payoff, add_target


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
    """Serve a target with batched speculative decoding over an OpenAI-compatible HTTP API.

    Routes: POST /v1/completions, POST /v1/chat/completions (``"stream": true`` for SSE),
    GET /v1/models, GET /health (503 when the engine is dead or draining), GET /metrics
    (Prometheus), GET /openapi.json.
    """
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
