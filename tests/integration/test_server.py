"""The OpenAI-compatible server over real HTTP on loopback: outputs, streams, errors, metrics (DESIGN §10)."""

from __future__ import annotations

import json

import httpx
import pytest

from dspark.targets import TargetAdapter

from .server_harness import MODEL, make_worker, scrape, serving


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> TargetAdapter:
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    return TargetAdapter.from_pretrained(build_tiny_chat_target(tmp_path_factory.mktemp("chat_target")))


@pytest.fixture(scope="module")
def url(target):
    with serving(make_worker(target, max_seq_len=128)) as base:
        yield base


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=30) as c:
        yield c


CHAT = {"messages": [{"role": "user", "content": "Explain how a hash table resolves collisions."}]}
COMPLETION = {"prompt": "def add(a, b):"}
ENDPOINTS = {"completions": COMPLETION, "chat/completions": CHAT}


def sse_events(response: httpx.Response) -> list[dict]:
    """The JSON events of an SSE body; asserts the framing and the final ``data: [DONE]``."""
    assert response.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in response.text.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks), blocks
    assert blocks[-1] == "data: [DONE]" and "[DONE]" not in "".join(blocks[:-1])
    return [json.loads(b[len("data: ") :]) for b in blocks[:-1]]


def joined(events: list[dict], chat: bool) -> tuple[str, str | None]:
    """Concatenated text deltas and the last finish reason of a stream."""
    text, reason = "", None
    for e in events:
        for choice in e["choices"]:
            text += (choice["delta"].get("content") or "") if chat else choice["text"]
            reason = choice["finish_reason"] or reason
    return text, reason


def complete(client, url, endpoint, **fields) -> dict:
    r = client.post(f"{url}/v1/{endpoint}", json={**ENDPOINTS[endpoint], "model": MODEL, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def text_of(body: dict) -> str:
    choice = body["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0}, {"temperature": 0.9, "top_p": 0.9, "top_k": 50, "seed": 7}],
    ids=["greedy", "seeded"],
)
def test_streamed_chunks_join_to_the_non_streamed_output(client, url, endpoint, sampling):
    fields = {"max_tokens": 40, **sampling}
    body = complete(client, url, endpoint, **fields)
    assert body["usage"]["completion_tokens"] == 40 and body["choices"][0]["finish_reason"] == "length"
    assert body["model"] == MODEL
    stream = client.post(
        f"{url}/v1/{endpoint}",
        json={**ENDPOINTS[endpoint], **fields, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert stream.status_code == 200
    events = sse_events(stream)
    chat = endpoint.startswith("chat")
    assert joined(events, chat) == (text_of(body), "length")
    assert len({e["id"] for e in events}) == 1 and len(events) > 3  # token by token, one id
    assert events[-1]["usage"] == body["usage"] and events[-1]["choices"] == []
    if chat:
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_stop_strings_cut_streamed_and_non_streamed_alike(client, url, endpoint):
    full = text_of(complete(client, url, endpoint, max_tokens=40, temperature=0))
    stop = next(full[i : i + 3] for i in range(len(full) // 2, len(full)) if full[i : i + 3].strip())
    body = complete(client, url, endpoint, max_tokens=40, temperature=0, stop=[stop, "\x00never"])
    expected = full[: full.index(stop)]
    assert text_of(body) == expected and body["choices"][0]["finish_reason"] == "stop"
    stream = client.post(
        f"{url}/v1/{endpoint}",
        json={**ENDPOINTS[endpoint], "max_tokens": 40, "temperature": 0, "stop": stop, "stream": True},
    )
    assert joined(sse_events(stream), endpoint.startswith("chat")) == (expected, "stop")


def test_token_id_prompts_and_models(client, url, target):
    ids = target.tokenizer("def add(a, b):")["input_ids"]
    by_ids = complete(client, url, "completions", prompt=ids, max_tokens=12, temperature=0)
    by_text = complete(client, url, "completions", max_tokens=12, temperature=0)
    assert text_of(by_ids) == text_of(by_text) and by_ids["usage"]["prompt_tokens"] == len(ids)
    models = client.get(f"{url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL] and models["data"][0]["max_model_len"] == 128
    assert client.get(f"{url}/health").json() == {"status": "ok"}


TOO_LONG = "collisions " * 400
BAD_REQUESTS = [
    # (name, endpoint, body (dict, or raw bytes), expected status)
    ("malformed json", "completions", b'{"prompt": "x",', 400),
    ("json array", "completions", b"[1, 2]", 400),
    ("not json at all", "completions", b"prompt=x", 400),
    ("empty body", "completions", b"", 400),
    ("missing prompt", "completions", {"max_tokens": 5}, 400),
    ("prompt wrong type", "completions", {"prompt": 5}, 400),
    ("max_tokens string", "completions", {"prompt": "x", "max_tokens": "10"}, 400),
    ("max_tokens float", "completions", {"prompt": "x", "max_tokens": 1.5}, 400),
    ("stream not bool", "completions", {"prompt": "x", "stream": "yes"}, 400),
    ("max_tokens 0", "completions", {"prompt": "x", "max_tokens": 0}, 400),
    ("max_tokens negative", "chat/completions", {**CHAT, "max_tokens": -3}, 400),
    ("temperature negative", "completions", {"prompt": "x", "temperature": -0.1}, 400),
    ("temperature string", "chat/completions", {**CHAT, "temperature": "hot"}, 400),
    ("top_p 0", "completions", {"prompt": "x", "top_p": 0}, 400),
    ("top_p above 1", "chat/completions", {**CHAT, "top_p": 1.5}, 400),
    ("top_k below -1", "completions", {"prompt": "x", "top_k": -2}, 400),
    ("n 2", "completions", {"prompt": "x", "n": 2}, 400),
    ("unknown model", "completions", {"prompt": "x", "model": "gpt-4"}, 404),
    ("unknown model chat", "chat/completions", {**CHAT, "model": "gpt-4"}, 404),
    ("prompt too long", "completions", {"prompt": TOO_LONG}, 400),
    ("token prompt too long", "completions", {"prompt": [5] * 128}, 400),
    ("chat too long", "chat/completions", {"messages": [{"role": "user", "content": TOO_LONG}]}, 400),
    ("token outside vocab", "completions", {"prompt": [1, 10**6]}, 400),
    ("negative token", "completions", {"prompt": [-1]}, 400),
    ("no messages", "chat/completions", {"messages": []}, 400),
    ("messages not a list", "chat/completions", {"messages": "hi"}, 400),
    ("unknown role", "chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400),
    ("template kwargs clash", "chat/completions", {**CHAT, "chat_template_kwargs": {"tokenize": True}}, 400),
    ("empty stop string", "completions", {"prompt": "x", "stop": [""]}, 400),
    ("seed out of range", "completions", {"prompt": "x", "seed": 2**70}, 400),
]


# Every JSON-object case again with "stream": true (the streaming path validates the same way).
BAD_CASES = [(*case, False) for case in BAD_REQUESTS] + [
    (*case, True) for case in BAD_REQUESTS if isinstance(case[2], dict) and "stream" not in case[2]
]


@pytest.mark.parametrize(
    "name,endpoint,body,status,stream",
    BAD_CASES,
    ids=[f"{c[0]}{' (stream)' if c[4] else ''}" for c in BAD_CASES],
)
def test_bad_requests_are_4xx_json(client, url, name, endpoint, body, status, stream):
    if isinstance(body, bytes):
        json_type = (
            {} if name == "not json at all" else {"content-type": "application/json"}
        )  # curl -d: a form
        r = client.post(f"{url}/v1/{endpoint}", content=body, headers=json_type)
    else:
        r = client.post(f"{url}/v1/{endpoint}", json={**body, "stream": True} if stream else body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)


def test_routes_and_methods(client, url):
    assert client.get(f"{url}/v1/nothing").status_code == 404
    r = client.get(f"{url}/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["type"]
    schema = client.get(f"{url}/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"} <= set(
        schema["paths"]
    )
    assert "422" not in json.dumps(schema["paths"])  # bad input is a 400, documented as such


def test_metrics_count_requests_and_speculation(client, url):
    complete(client, url, "completions", max_tokens=20, temperature=0, prompt="x x x x x x x x x x")
    m = scrape(client, url)
    assert m["dspark_requests_total{endpoint=/v1/completions,status=200}"] >= 1
    assert m["dspark_rounds_total"] > 0 and m["dspark_draft_tokens_total"] > 0
    assert m["dspark_accepted_tokens_total"] <= m["dspark_draft_tokens_total"]
    tau = (m["dspark_accepted_tokens_total"] + m["dspark_rounds_total"]) / m["dspark_rounds_total"]
    assert m["dspark_mean_tau"] == pytest.approx(tau)
    assert m["dspark_verification_budget_count"] >= 1
    assert m["dspark_request_latency_seconds_count{endpoint=/v1/completions}"] >= 1
    assert m["dspark_kv_slots{}" if "dspark_kv_slots{}" in m else "dspark_kv_slots"] == 4
    assert m["dspark_engine_alive"] == 1
    # the controller's decisions are visible: rounds planned, rounds decoded plainly, their share
    assert 0 <= m["dspark_engine_plain_rounds_total"] <= m["dspark_engine_planned_rounds_total"]
    assert 0.0 <= m["dspark_plain_round_share"] <= 1.0
