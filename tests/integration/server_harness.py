"""A real ``dspark`` server on loopback for the server tests: uvicorn in a thread, a tiny engine.

The target is the tiny random chat model of the data tests (4 layers, hidden 64, a
byte-level BPE with the tiny target's chat template), so a request of 100 tokens takes
a fraction of a second on one CPU thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families

from dspark.drafters.ngram import NgramDrafter
from dspark.engine import Engine, EngineConfig
from dspark.engine.worker import EngineWorker
from dspark.scheduler import SpsTable
from dspark.server.app import create_app
from dspark.server.uvicorn_runner import serve_in_thread

MODEL = "tiny-test"
# A saturating cost curve, so that the prefix policy runs without profiling the machine.
SPS = SpsTable.from_dict({b: 1.0 / (1.0 + b / 16) for b in range(1, 300)})


def make_worker(
    target,
    *,
    drafter=True,
    policy: str = "fixed",
    max_batch: int = 4,
    max_seq_len: int = 128,
    payoff: bool = False,
):
    """An engine worker over ``target``; ``policy="prefix", payoff=True`` are ``dspark serve``'s defaults."""
    config = EngineConfig(
        policy=policy, max_batch=max_batch, max_seq_len=max_seq_len, block_size=4, payoff=payoff
    )
    engine = Engine(target, NgramDrafter(target.vocab_size) if drafter is True else drafter, config, sps=SPS)
    return EngineWorker(engine, idle_wait_s=0.01)


@contextlib.contextmanager
def serving(worker: EngineWorker, **app_kwargs) -> Iterator[str]:
    """``create_app(worker)`` on 127.0.0.1 (a free port) in a thread; yields the base URL."""
    try:
        with serve_in_thread(create_app(worker, MODEL, **app_kwargs)) as url:
            yield url
    finally:
        worker.close(timeout=10)


def scrape(client, url: str) -> dict[str, float]:
    """``/metrics`` as ``{"name{label=value,...}": value}``."""
    text = client.get(f"{url}/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out
