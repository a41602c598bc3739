"""Serving under load: aggregate throughput against per-user speed, per verification policy.

For each policy, a fresh engine is put behind the real server (uvicorn on loopback, real
HTTP) and loaded by ``c`` closed-loop clients for each concurrency ``c``: every client
sends its next streamed request as soon as the previous one ends. A point reports

- **throughput**: completion tokens per second over all clients (what the operator buys);
- **per-user tokens/s**: each request's completion tokens over its latency, averaged
  (what one user sees);
- τ and the verification budget (mean draft tokens verified per request per round)
  over the point's rounds, from the server's ``/metrics``.

This is the trade-off of paper §5 / DeepSeek-V4: the hardware-aware ``prefix`` policy
should sit on the upper envelope, verifying more per request at low load and less as
the batch fills. ``none`` is plain decoding, the baseline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from dspark.engine import Engine, EngineConfig
from dspark.engine.profile import load_or_profile
from dspark.engine.worker import EngineWorker
from dspark.protocols import acceptance_length
from dspark.scheduler import SpsTable
from dspark.server.app import create_app
from dspark.server.uvicorn_runner import serve_in_thread
from dspark.targets.flat import KVStore

PLAIN = "none"


@dataclass(frozen=True)
class LoadPoint:
    policy: str
    concurrency: int
    requests: int
    tokens: int
    seconds: float
    throughput: float  # completion tokens/s over all clients
    per_user: float  # mean over requests of tokens / latency
    tau: float
    verify_budget: float  # mean draft tokens verified per request per round

    def as_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}


def _counters(text: str) -> dict[str, float]:
    wanted = ("dspark_rounds_total", "dspark_accepted_tokens_total", "dspark_draft_tokens_total")
    return {
        s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name in wanted
    }


async def closed_loop(
    url: str, prompts: Sequence[str], *, concurrency: int, requests_per_client: int, max_tokens: int
) -> tuple[int, int, float, float]:
    """``(requests, tokens, seconds, mean per-user tokens/s)`` of one closed-loop run."""
    per_user: list[float] = []
    tokens = 0

    async def client(i: int, http: httpx.AsyncClient) -> None:
        nonlocal tokens
        for j in range(requests_per_client):
            prompt = prompts[(i * requests_per_client + j) % len(prompts)]
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
            started = time.perf_counter()
            n = 0
            async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and '"usage"' in line:
                        n = json.loads(line[len("data: ") :])["usage"]["completion_tokens"]
            per_user.append(n / (time.perf_counter() - started))
            tokens += n

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(i, http) for i in range(concurrency)))
        seconds = time.perf_counter() - started
    return len(per_user), tokens, seconds, sum(per_user) / len(per_user)


def bench_serve(
    target,
    drafter,
    policies: Sequence[str],
    concurrencies: Sequence[int],
    prompts: Sequence[str],
    *,
    max_tokens: int = 64,
    requests_per_client: int = 2,
    min_requests: int = 1,
    block_size: int = 7,
    max_seq_len: int = 512,
    sps: SpsTable | None = None,
    sps_path: Path | None = None,
    payoff: bool = True,
    choose_proposer: bool = True,
    progress: Callable[[LoadPoint], None] | None = None,
) -> list[LoadPoint]:
    """Every policy at every concurrency (see the module docstring); policy ``none`` = plain decoding.

    Each client sends ``requests_per_client`` requests, more if the point would have fewer
    than ``min_requests``; client i's j-th request is prompt ``i * n + j``, so every point
    starts from the same prompts. The engine has ``max(concurrencies)`` KV slots, so no
    request ever waits for one.
    """
    if sps is None and drafter is not None and (payoff or any(p.startswith("prefix") for p in policies)):
        # One profile for every engine (loaded from sps_path or the per-target cache when there).
        capacity = min(max_seq_len, target.max_context)
        store = KVStore.for_target(target, num_slots=max(concurrencies), capacity=capacity)
        sps = load_or_profile(target, store, block_size=block_size, path=sps_path)
    points = []
    for policy in policies:
        config = EngineConfig(
            block_size=0 if policy == PLAIN else block_size,
            policy="fixed" if policy == PLAIN else policy,
            max_batch=max(concurrencies),
            max_seq_len=max_seq_len,
            payoff=payoff,
            choose_proposer=choose_proposer,
        )
        worker = EngineWorker(Engine(target, None if policy == PLAIN else drafter, config, sps=sps))
        app = create_app(worker, "bench", max_queue=max(concurrencies))
        try:
            with serve_in_thread(app) as url, httpx.Client(timeout=60) as scraper:
                # warm-up: first-call initialisation must not bill the first point
                asyncio.run(closed_loop(url, prompts, concurrency=1, requests_per_client=2, max_tokens=8))
                for c in concurrencies:
                    before = _counters(scraper.get(f"{url}/metrics").text)
                    per_client = max(requests_per_client, -(-min_requests // c))
                    n, tokens, seconds, per_user = asyncio.run(
                        closed_loop(
                            url, prompts, concurrency=c, requests_per_client=per_client, max_tokens=max_tokens
                        )
                    )
                    after = _counters(scraper.get(f"{url}/metrics").text)
                    d = {k: after[k] - before.get(k, 0.0) for k in after}
                    rounds = d["dspark_rounds_total"] or 1.0
                    point = LoadPoint(
                        policy=policy,
                        concurrency=c,
                        requests=n,
                        tokens=tokens,
                        seconds=seconds,
                        throughput=tokens / seconds,
                        per_user=per_user,
                        tau=acceptance_length(d["dspark_accepted_tokens_total"], rounds),
                        verify_budget=d["dspark_draft_tokens_total"] / rounds,
                    )
                    points.append(point)
                    if progress is not None:
                        progress(point)
        finally:
            worker.close(timeout=30)
    return points


def plot_load(points: Sequence[LoadPoint], path: Path) -> Path:
    """Aggregate throughput (x) against per-user tokens/s (y), one line per policy, points labelled by c."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for policy in dict.fromkeys(p.policy for p in points):
        mine = sorted((p for p in points if p.policy == policy), key=lambda p: p.concurrency)
        label = "plain decoding" if policy == PLAIN else policy
        ax.plot([p.throughput for p in mine], [p.per_user for p in mine], marker="o", label=label)
        for p in mine:
            ax.annotate(str(p.concurrency), (p.throughput, p.per_user), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")  # fmt: skip
    ax.set_xlabel("aggregate throughput (completion tokens/s)")
    ax.set_ylabel("per-user speed (tokens/s per request)")
    ax.set_title("Serving: throughput vs per-user speed (labels: concurrent clients)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
