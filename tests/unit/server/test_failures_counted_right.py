"""Failures counted as what they are (issue 40): a client that hung up is not a server 500, a real
server failure still is; an API key means the same from its three sources."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from dspark.errors import DsparkError
from dspark.server.app import CLIENT_CLOSED, ApiKeyMiddleware, RequestMetricsMiddleware
from dspark.server.identity import API_KEY_ENV, resolve_api_key
from dspark.server.metrics import ServerMetrics

# -- /metrics: dspark_requests_total{status} --------------------------------------------------


async def _hangs_up_while_uploading(receive, send) -> None:
    """What BodyLimitMiddleware does when the client leaves mid-body: returns, answers nothing."""
    while (await receive())["type"] == "http.request":
        pass


async def _answers_nothing(receive, send) -> None:
    return None


async def _raises(receive, send) -> None:
    await receive()
    raise RuntimeError("a bug")


async def _answers(receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def _count(app, messages: list[dict], path: str = "/v1/completions") -> dict[str, float]:
    """Run ``app`` behind the metrics middleware on one request; the statuses it counted."""
    metrics = ServerMetrics(block_size=4)
    middleware = RequestMetricsMiddleware(lambda scope, receive, send: app(receive, send), metrics)
    inbox = list(messages)

    async def receive():
        return inbox.pop(0) if inbox else {"type": "http.disconnect"}

    async def send(message):
        pass

    scope = {"type": "http", "path": path, "method": "POST", "headers": []}
    with contextlib.suppress(RuntimeError):  # the bug, re-raised to uvicorn as in the app
        asyncio.run(middleware(scope, receive, send))
    return {
        s.labels["status"]: s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "dspark_requests_total"
    }


PART = {"type": "http.request", "body": b'{"prompt": "hel', "more_body": True}
GONE = {"type": "http.disconnect"}
WHOLE = {"type": "http.request", "body": b"{}", "more_body": False}


def test_a_client_that_hangs_up_while_uploading_is_499_not_500():
    assert _count(_hangs_up_while_uploading, [PART, GONE]) == {str(CLIENT_CLOSED): 1.0}


def test_server_failures_are_still_500():
    # Negative controls: no answer with the client still there, and a bug (even after it left).
    assert _count(_answers_nothing, [WHOLE]) == {"500": 1.0}
    assert _count(_raises, [PART, GONE]) == {"500": 1.0}
    assert _count(_answers, [GONE]) == {"200": 1.0}


# -- the API key ---------------------------------------------------------------------------


@pytest.mark.parametrize("written", [" secret", "secret\n", "\tsecret  ", "secret"])
def test_a_key_is_stripped_the_same_from_flag_file_and_environment(tmp_path, written):
    key_file = tmp_path / "key"
    key_file.write_text(written)
    from_flag = resolve_api_key(written, None, environ={})
    from_file = resolve_api_key(None, key_file, environ={})
    from_env = resolve_api_key(None, None, environ={API_KEY_ENV: written})
    assert from_flag == from_file == from_env == "secret"


@pytest.mark.parametrize("blank", ["", " ", "\n\t"])
def test_a_blank_key_is_refused_from_every_source(tmp_path, blank):
    key_file = tmp_path / "key"
    key_file.write_text(blank)
    for key, path, env in ((blank, None, {}), (None, key_file, {}), (None, None, {API_KEY_ENV: blank})):
        with pytest.raises(DsparkError, match="empty"):
            resolve_api_key(key, path, environ=env)


def _status_with(key: str, authorization: bytes) -> int:
    statuses = []

    async def app(scope, receive, send):
        statuses.append(200)

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def receive():
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "path": "/v1/models", "headers": [(b"authorization", authorization)]}
    asyncio.run(ApiKeyMiddleware(app, key)(scope, receive, send))
    return statuses[0]


def test_a_stripped_key_authenticates_the_client_that_sends_it():
    key = resolve_api_key(None, None, environ={API_KEY_ENV: " secret"})
    assert _status_with(key, b"Bearer secret") == 200
    assert _status_with("secret", b"Bearer wrong") == 401
    # Negative control: the unstripped key (the defect) matches no client, however it sends it.
    for sent in (b"Bearer secret", b"Bearer  secret", b"Bearer \tsecret"):
        assert _status_with(" secret", sent) == 401
