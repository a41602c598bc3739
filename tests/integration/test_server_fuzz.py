"""Schemathesis fuzzes the server's own OpenAPI schema over real HTTP: no 5xx, responses as documented.

Per operation, 50 schema-valid requests (positive) and, for the POST endpoints, 50
schema-violating ones (negative: these must be rejected with a 4xx). Checks: no server
error, documented status codes, content types and response bodies, invalid data
rejected. Schema-valid data may still be refused (unknown model 404, prompt too long
400, 429), so "valid data accepted" is not checked.
"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from dspark.targets import TargetAdapter  # noqa: E402

from .server_harness import make_worker, serving  # noqa: E402

EXAMPLES = 50
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
OPERATIONS = [
    ("POST", "/v1/completions", GenerationMode.POSITIVE),
    ("POST", "/v1/completions", GenerationMode.NEGATIVE),
    ("POST", "/v1/chat/completions", GenerationMode.POSITIVE),
    ("POST", "/v1/chat/completions", GenerationMode.NEGATIVE),
    ("GET", "/v1/models", GenerationMode.POSITIVE),
    ("GET", "/health", GenerationMode.POSITIVE),
    ("GET", "/metrics", GenerationMode.POSITIVE),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    target = TargetAdapter.from_pretrained(build_tiny_chat_target(tmp_path_factory.mktemp("chat_target")))
    # Short contexts keep every fuzzed generation to < 64 tokens; the prefix policy runs too.
    with serving(make_worker(target, policy="prefix", max_batch=4, max_seq_len=64), max_queue=8) as url:
        yield url, schemathesis.openapi.from_url(f"{url}/openapi.json")


@pytest.mark.parametrize("method,path,mode", OPERATIONS, ids=[f"{m} {p} {g.value}" for m, p, g in OPERATIONS])
def test_fuzzed_requests_never_get_a_5xx(served, method, path, mode):
    url, schema = served
    operation = schema[path][method]
    checks = CHECKS + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])
    seen = []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case):
        response = case.call_and_validate(base_url=url, checks=checks, timeout=30)
        seen.append(response.status_code)

    fuzz()
    # A GET without parameters has a single possible request.
    assert len(seen) >= (EXAMPLES if method == "POST" else 1) and all(code < 500 for code in seen)
    print(f"{method} {path} {mode.value}: {len(seen)} requests, statuses {sorted(set(seen))}")
