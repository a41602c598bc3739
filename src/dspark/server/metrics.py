"""Prometheus metrics of one server, in a registry of its own (DESIGN §10).

Speculation figures use the terms of DESIGN §2 and come from the rounds of every request
that left the engine (finished or cancelled), through the worker's ``on_finish`` hook:

- ``dspark_rounds_total`` — decode rounds (one per request per engine step);
- ``dspark_drafts_total`` — rounds that verified at least one draft token;
- ``dspark_draft_tokens_total`` — draft tokens sent to verification (Σ ℓ_r);
- ``dspark_accepted_tokens_total`` — draft tokens accepted;
- ``dspark_accepted_position_total{position="k"}`` — rounds whose first k drafts were
  all accepted (over ``dspark_drafts_total``: prefix survival at k);
- ``dspark_mean_tau`` — acceptance length τ = (accepted + rounds) / rounds;
- ``dspark_verification_budget`` — per request, mean draft tokens verified per round
  (what the scheduler granted it);
- ``dspark_request_latency_seconds`` / ``dspark_time_to_first_token_seconds`` — per
  endpoint, as the client sees them.

State gauges are read at scrape time: the engine's queue, running requests and KV
slots, the server's admitted requests, whether the engine is alive. Counts of the
engine's own steps (``dspark_engine_*``) come from :class:`~dspark.engine.EngineStats`,
among them the speculation controller's decisions (``dspark_engine_planned_rounds`` /
``dspark_engine_plain_rounds`` and their ratio ``dspark_plain_round_share``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dspark.protocols import GenerationResult, acceptance_length

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ServerMetrics:
    """The metrics of one app; ``observe_result`` is the engine worker's ``on_finish`` hook."""

    def __init__(self, *, block_size: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.block_size = max(block_size, 1)
        self.requests = Counter(
            "dspark_requests",
            "HTTP requests answered, by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.finished = Counter(
            "dspark_finished_requests",
            "requests that left the engine, by finish reason",
            ["reason"],
            registry=r,
        )
        self.rounds = Counter("dspark_rounds", "decode rounds (one per request per engine step)", registry=r)
        self.drafts = Counter("dspark_drafts", "rounds that verified at least one draft token", registry=r)
        self.draft_tokens = Counter("dspark_draft_tokens", "draft tokens sent to verification", registry=r)
        self.accepted_tokens = Counter("dspark_accepted_tokens", "draft tokens accepted", registry=r)
        self.accepted_position = Counter(
            "dspark_accepted_position",
            "rounds whose first k draft tokens were all accepted",
            ["position"],
            registry=r,
        )
        self.prompt_tokens = Counter("dspark_prompt_tokens", "prompt tokens of admitted requests", registry=r)
        self.generated_tokens = Counter("dspark_generated_tokens", "tokens generated", registry=r)
        self._counts = [0, 0]  # rounds, accepted draft tokens: for τ (written by the worker thread only)
        self.tau = Gauge("dspark_mean_tau", "acceptance length τ over all rounds, bonus included", registry=r)
        self.tau.set_function(self._tau)
        budget_buckets = tuple(b / 2 for b in range(0, 2 * self.block_size + 1))
        self.budget = Histogram(
            "dspark_verification_budget",
            "per request: mean draft tokens verified per round",
            buckets=budget_buckets,
            registry=r,
        )
        self.latency = Histogram(
            "dspark_request_latency_seconds",
            "request latency, arrival to last byte",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "dspark_time_to_first_token_seconds",
            "streamed requests: arrival to the first generated token",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def observe_result(self, result: GenerationResult) -> None:
        """Count one request's rounds (called on the engine's worker thread)."""
        self.finished.labels(result.finish_reason).inc()
        self.generated_tokens.inc(len(result.token_ids))
        rounds = result.rounds
        if not rounds:
            return
        accepted = sum(r.accepted for r in rounds)
        self._counts = [self._counts[0] + len(rounds), self._counts[1] + accepted]  # one swap: read whole
        self.rounds.inc(len(rounds))
        self.drafts.inc(sum(r.proposed > 0 for r in rounds))
        self.draft_tokens.inc(sum(r.proposed for r in rounds))
        self.accepted_tokens.inc(accepted)
        for k in range(1, max(r.accepted for r in rounds) + 1):
            self.accepted_position.labels(str(k)).inc(sum(r.accepted >= k for r in rounds))
        self.budget.observe(sum(r.proposed for r in rounds) / len(rounds))

    def _tau(self) -> float:
        rounds, accepted = self._counts
        return acceptance_length(accepted, rounds)

    def watch(self, collector: Collector) -> None:
        self.registry.register(collector)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class EngineCollector(Collector):
    """Gauges of the engine and the server read at scrape time (plain reads of counters that
    the worker thread updates; a scrape may see a step half-counted, never a torn value)."""

    def __init__(self, worker, in_flight) -> None:
        self.worker, self.in_flight = worker, in_flight

    def describe(self):
        return []

    def collect(self):
        engine = self.worker.engine
        slots = engine.kv.store.num_slots
        yield _gauge("dspark_queue_depth", "requests waiting for a KV slot", engine.num_queued)
        yield _gauge("dspark_running_requests", "requests holding a KV slot", engine.num_active)
        yield _gauge("dspark_kv_slots_used", "KV slots held by requests", slots - engine.kv.num_free)
        yield _gauge("dspark_kv_slots", "KV slots (most requests decoded at once)", slots)
        yield _gauge(
            "dspark_requests_in_flight", "requests admitted by the server, not yet answered", self.in_flight()
        )
        yield _gauge("dspark_engine_alive", "1 while the engine's step loop runs", float(self.worker.alive))
        stats = engine.stats
        yield _counter("dspark_engine_steps", "engine steps", stats.steps)
        yield _counter(
            "dspark_engine_forward_tokens", "tokens through the target's forwards", stats.forward_tokens
        )
        yield _counter("dspark_engine_proposed_tokens", "draft tokens the drafter proposed", stats.drafted)
        yield _counter("dspark_engine_step_seconds", "time spent in engine steps", stats.step_s)
        yield _counter(
            "dspark_engine_planned_rounds",
            "decode rounds the speculation controller planned",
            stats.planned_rounds,
        )
        yield _counter(
            "dspark_engine_plain_rounds",
            "decode rounds the controller decoded plainly: drafting was predicted not to pay",
            stats.plain_rounds,
        )
        share = stats.plain_rounds / stats.planned_rounds if stats.planned_rounds else 0.0
        yield _gauge(
            "dspark_plain_round_share",
            "share of planned rounds decoded plainly (1: drafting does not pay here)",
            share,
        )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)
