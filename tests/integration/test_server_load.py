"""The server under pressure: abandoned requests free their KV, the queue is bounded, keys, a dead engine."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from dspark.engine import Engine, EngineConfig
from dspark.engine.worker import EngineWorker
from dspark.targets import TargetAdapter

from .server_harness import make_worker, scrape, serving

LONG = {"prompt": "def add(a, b):", "max_tokens": 100, "temperature": 0.8, "seed": 1}


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> TargetAdapter:
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    return TargetAdapter.from_pretrained(build_tiny_chat_target(tmp_path_factory.mktemp("chat_target")))


def wait_for_baseline(client: httpx.Client, url: str, timeout: float = 15.0) -> dict:
    """Poll /metrics until nothing is in flight, queued, running or holding KV."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(client, url)
        idle = (
            "dspark_requests_in_flight",
            "dspark_queue_depth",
            "dspark_running_requests",
            "dspark_kv_slots_used",
        )
        if all(m[k] == 0 for k in idle):
            return m
        assert time.monotonic() < deadline, {k: m[k] for k in idle}
        time.sleep(0.05)


def test_abandoned_requests_are_cancelled_and_free_their_kv(target):
    """100 concurrent requests whose clients give up once all of them are in the engine: every
    one still running is cancelled there (not run to its 100 tokens), the gauges return to
    zero, and the server still serves."""
    worker = make_worker(target, max_batch=4, max_seq_len=128)
    with serving(worker, max_queue=200) as url, httpx.Client(timeout=30) as client:
        baseline = scrape(client, url)
        assert baseline["dspark_kv_slots_used"] == 0

        def left_engine(m: dict) -> dict:
            return {k: v for k, v in m.items() if k.startswith("dspark_finished_requests_total")}

        def reached_engine(m: dict) -> float:
            return m["dspark_queue_depth"] + m["dspark_running_requests"] + sum(left_engine(m).values())

        async def patient(i: int, http: httpx.AsyncClient) -> None:
            body = {**LONG, "seed": i, "stream": i % 2 == 0}
            r = await http.post(f"{url}/v1/completions", json=body)
            await r.aread()

        async def flood_then_give_up() -> None:
            # The clients give up only once every request reached the engine (queued, running or
            # finished), so a loaded machine cannot turn the test into one about connecting.
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
            async with httpx.AsyncClient(limits=limits, timeout=None) as http:
                tasks = [asyncio.create_task(patient(i, http)) for i in range(100)]
                deadline = time.monotonic() + 60
                while reached_engine(await asyncio.to_thread(scrape, client, url)) < 100:
                    assert time.monotonic() < deadline, "the requests never all reached the engine"
                    await asyncio.sleep(0.02)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run(flood_then_give_up())
        m = wait_for_baseline(client, url)
        finished = left_engine(m)
        assert sum(finished.values()) == 100, finished
        completed = finished.get("dspark_finished_requests_total{reason=length}", 0)
        cancelled = finished.get("dspark_finished_requests_total{reason=cancelled}", 0)
        assert completed + cancelled == 100, finished
        assert cancelled >= 50, finished  # 100 x 100 tokens through 4 slots take many seconds
        # A cancelled request stops where it was: at most the 4 running ones had generated tokens.
        assert m["dspark_generated_tokens_total"] <= 100 * (completed + 4), m

        r = client.post(f"{url}/v1/completions", json={**LONG, "max_tokens": 10})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 10
        wait_for_baseline(client, url)


def test_queue_bound_answers_429(target):
    """max_batch 1 + max_queue 1: two long streams are admitted, a third request gets 429."""
    worker = make_worker(target, max_batch=1, max_seq_len=256)
    with serving(worker, max_queue=1) as url, httpx.Client(timeout=30) as client:

        async def main():
            async with httpx.AsyncClient(timeout=30) as http:
                body = {**LONG, "max_tokens": 240, "stream": True}
                async with (
                    http.stream("POST", f"{url}/v1/completions", json=body) as first,
                    http.stream("POST", f"{url}/v1/completions", json=body) as second,
                ):
                    assert first.status_code == second.status_code == 200  # both admitted
                    third = await http.post(f"{url}/v1/completions", json={**LONG, "max_tokens": 5})
                    assert third.status_code == 429 and third.headers["retry-after"] == "1"
                    assert third.json()["error"]["type"] == "rate_limit_error"
                    m = scrape(client, url)
                    assert m["dspark_requests_in_flight"] == 2 and m["dspark_queue_depth"] <= 1
                # both streams closed early by the client: their places come back
            wait_for_baseline(client, url)
            async with httpx.AsyncClient(timeout=30) as http:
                again = await http.post(f"{url}/v1/completions", json={**LONG, "max_tokens": 5})
                assert again.status_code == 200

        asyncio.run(main())


def test_api_key_on_every_route_but_health(target):
    with serving(make_worker(target), api_key="sekrit") as url, httpx.Client(timeout=30) as client:
        body = {"prompt": "x", "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
            for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/metrics")):
                r = client.request(method, f"{url}{path}", json=body, headers=headers)
                assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", path
        # a bad key is refused before the body is even looked at
        assert client.post(f"{url}/v1/completions", content=b"{oops").status_code == 401
        assert client.get(f"{url}/health").status_code == 200
        ok = {"Authorization": "Bearer sekrit"}
        assert client.post(f"{url}/v1/completions", json=body, headers=ok).status_code == 200
        assert client.get(f"{url}/v1/models", headers=ok).status_code == 200
        assert client.get(f"{url}/metrics", headers=ok).status_code == 200
        schema = client.get(f"{url}/openapi.json", headers=ok).json()
        assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


class ExplodingDrafter:
    target_layer_ids: tuple[int, ...] = ()

    def propose(self, states, max_len, sampling):
        raise RuntimeError("drafter exploded")

    def update(self, state, num_accepted, new_features):
        pass


def test_a_failing_drafter_fails_its_requests_not_the_server(target):
    with (
        serving(make_worker(target, drafter=ExplodingDrafter()), max_queue=4) as url,
        httpx.Client(timeout=30) as client,
    ):
        for _ in range(2):  # the first failure left the engine serving
            r = client.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 5})
            assert r.status_code == 500 and "drafter exploded" in r.json()["error"]["message"]
            assert client.get(f"{url}/health").status_code == 200
        assert scrape(client, url)["dspark_engine_alive"] == 1


class EngineWithABrokenLoop(Engine):
    """An engine whose step fails outside any request (admission, say): the loop itself dies."""

    def step(self):
        raise RuntimeError("engine loop bug")


def test_dead_engine_is_503(target):
    engine = EngineWithABrokenLoop(target, None, EngineConfig(payoff=False, max_batch=4, max_seq_len=128))
    with (
        serving(EngineWorker(engine, idle_wait_s=0.01), max_queue=4) as url,
        httpx.Client(timeout=30) as client,
    ):
        assert client.get(f"{url}/health").status_code == 200
        r = client.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 5})
        assert r.status_code == 503 and "engine loop bug" in r.json()["error"]["message"]
        health = client.get(f"{url}/health")
        assert health.status_code == 503 and health.json()["error"]["type"] == "service_unavailable"
        for stream in (False, True):
            r = client.post(f"{url}/v1/completions", json={"prompt": "x", "stream": stream})
            assert r.status_code == 503
        assert scrape(client, url)["dspark_engine_alive"] == 0
